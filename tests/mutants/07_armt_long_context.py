"""Planted wrong answers for notebooks/solutions/07_armt_long_context.ipynb.

MUTANTS: check cell id -> [(description, original text in the solution region, replacement)].
tests/test_mutants.py substitutes each one and proves the check cell rejects it.
"""

MUTANTS = {
    "nb07-05": [  # armt_state_bytes
        ("n_wrapped ignored: every layer counted as wrapped",
         "n_wrapped = n_layer if n_wrapped is None else n_wrapped", "n_wrapped = n_layer"),
        ("the memory tokens not cached",
         "(segment_size + n_mem_tokens)", "segment_size"),
        ("the normaliser z forgotten",
         "6 * d_mem * (d_model + 1)", "6 * d_mem * d_model"),
        ("DPFP expansion forgotten: 2 d_mem instead of 6 d_mem",
         "memory = n_wrapped * 6 * d_mem", "memory = n_wrapped * 2 * d_mem"),
        ("keys only, the values forgotten",
         "cache = n_layer * 2 *", "cache = n_layer *"),
        ("the batch forgotten",
         "return batch * (cache + memory)", "return (cache + memory)"),
    ],
    "nb07-10": [  # key_visible + best_possible_accuracy
        ("strict <: a key exactly window tokens back counted unseen",
         "distance <= window", "distance < window"),
        ("off by one: a key window + 1 tokens back counted seen",
         "distance <= window", "distance <= window + 1"),
        ("comparison the wrong way round",
         "distance <= window", "distance >= window"),
        ("no window (None) treated as a window of 0",
         "return window is None or distance <= window", "return distance <= (window or 0)"),
        ("an unseen key: accuracy 0 instead of chance",
         "else 1.0 / n_choices", "else 0.0"),
        ("chance over the whole vocabulary, not the content tokens",
         "else 1.0 / n_choices", "else 1.0 / V"),
    ],
    "nb07-14": [  # armt_flops + choose_memory_layers
        ("the LM head forgotten",
         "- (c.n_layer - n_memory_layers) * memory\n"
         "            + flops.lm_head_flops(c.d_model, c.vocab_size))",
         "- (c.n_layer - n_memory_layers) * memory)"),
        ("subtracts the memory of the wrapped layers, not the unwrapped ones",
         "(c.n_layer - n_memory_layers) * memory", "n_memory_layers * memory"),
        ("the lowest layers instead of the uppermost",
         "return tuple(range(n - k, n))", "return tuple(range(k))"),
        ("the fewest layers instead of the most that fit",
         "k = max(k for k", "k = min(k for k"),
        ("strict <: a budget of exactly 1.0 does not fit every layer",
         "<= budget * full", "< budget * full"),
        ("off by one: k never reaches n_layer",
         "for k in range(n + 1)", "for k in range(n)"),
    ],
    "nb07-19": [  # segments_reached
        ("the loss segment itself counted as an earlier segment",
         "return list(range(start, loss_segment))", "return list(range(start, loss_segment + 1))"),
        ("boundary off by one: (s - 1) // k * k",
         "loss_segment // detach_every * detach_every",
         "(loss_segment - 1) // detach_every * detach_every"),
        ("detaching ignored: every earlier segment reached",
         "start = 0 if detach_every == 0 else loss_segment // detach_every * detach_every",
         "start = 0"),
        ("reads detach_every as 'k segments back'",
         "loss_segment // detach_every * detach_every", "max(loss_segment - detach_every, 0)"),
    ],
}
