"""Planted wrong answers for notebooks/solutions/09_moc_knowledge_and_forgetting.ipynb.

MUTANTS: check cell id -> [(description, original text in the solution region, replacement)].
tests/test_mutants.py substitutes each one and proves the check cell rejects it.
"""

MUTANTS = {
    "nb09-05": [  # memory_layer_extra_flops + iso_flop_dense_layers
        ("the shared chapter not read: top_k * chapter_len",
         "n_read = (top_k + 1) * chapter_len", "n_read = top_k * chapter_len"),
        ("routing cost not amortised over route_every tokens",
         "+ per_route / route_every", "+ per_route"),
        ("the router scores (2 d C) dropped",
         "per_route = 2 * d * n_chapters + 4 * d * d * n_read", "per_route = 4 * d * d * n_read"),
        ("iso-FLOP layers rounded down instead of half up",
         "math.floor(extra / (24 * d * d + 2 * t * d) + 0.5)",
         "math.floor(extra / (24 * d * d + 2 * t * d))"),
        ("sequence routing ignored: always the routing window",
         'route_every = t if model_cfg.routing == "sequence" else min(model_cfg.routing_window, t)',
         "route_every = min(model_cfg.routing_window, t)"),
        ("one memory layer counted, whatever memory_layers says",
         "extra = len(moc.memory_layers(model_cfg)) * memory_layer_extra_flops(",
         "extra = memory_layer_extra_flops("),
        ("a dense layer's attention term (2 T d) forgotten",
         "extra / (24 * d * d + 2 * t * d)", "extra / (24 * d * d)"),
        ("memory_layer_extra_flops calls the kit's mechanisms.moc.moc_extra_flops",
         "n_read = (top_k + 1) * chapter_len",
         "return mechanisms.moc.moc_extra_flops(d, n_chapters, top_k, chapter_len, route_every)"),
        ("iso_flop_dense_layers calls the kit's metrics.iso_flop_dense_config",
         "d, t = model_cfg.d_model, model_cfg.seq_len",
         "return metrics.iso_flop_dense_config(model_cfg).n_layer"),
    ],
    "nb09-11": [  # lr_groups
        ("weight decay on every parameter, biases and norms too",
         "weight_decay if p.dim() >= 2 else 0.0", "weight_decay"),
        ("frozen parameters included",
         "if p.requires_grad:", "if True:"),
        ("lr scales ignored",
         "key = (lr * scales.get(name, 1.0),", "key = (lr,"),
        ("lr divided by the scale",
         "key = (lr * scales.get(name, 1.0),", "key = (lr / scales.get(name, 1.0),"),
        ("decay only for tensors of more than 2 dims (matrices excluded)",
         "if p.dim() >= 2 else 0.0", "if p.dim() > 2 else 0.0"),
        ("calls the kit's make_optimizer and reads its groups back",
         'scales = model.lr_scales() if callable(getattr(model, "lr_scales", None)) else {}',
         'return [(g["lr"], g["weight_decay"], {n for n, p in model.named_parameters()\n'
         '                                         if any(p is q for q in g["params"])})\n'
         '            for g in make_optimizer(model, TrainConfig(lr=lr, weight_decay=weight_decay))'
         '.param_groups]'),
    ],
    "nb09-15": [  # forgetting
        ("share of the score, not of the room above chance",
         "(before - after) / (before - chance)", "(before - after) / before"),
        ("points not multiplied by 100",
         "return 100 * (before - after),", "return (before - after),"),
        ("sign flipped: after - before",
         "return 100 * (before - after), (before - after)",
         "return 100 * (after - before), (after - before)"),
        ("room above chance measured after, not before",
         "/ (before - chance)", "/ (after - chance)"),
    ],
    "nb09-21": [  # relative_drift
        ("ratio of squared norms (roots forgotten)",
         "return math.sqrt(moved) / math.sqrt(size)", "return moved / size"),
        ("normalised by the norm after, not before",
         "size = sum(float((before[n].double() ** 2).sum())",
         "size = sum(float((after[n].double() ** 2).sum())"),
        ("absolute differences instead of squared ones",
         "((after[n] - before[n]).double() ** 2)", "((after[n] - before[n]).double().abs())"),
        ("not normalised: absolute drift",
         "return math.sqrt(moved) / math.sqrt(size)", "return math.sqrt(moved)"),
    ],
}
