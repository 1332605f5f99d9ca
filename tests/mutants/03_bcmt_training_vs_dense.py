"""Planted wrong answers for notebooks/solutions/03_bcmt_training_vs_dense.ipynb.

MUTANTS: check cell id -> [(description, original text in the solution region, replacement)].
tests/test_mutants.py substitutes each one and proves the check cell rejects it.
"""

OFF_RETURN = ('return {name: torch.zeros_like(value) if name.endswith("memory_proj.weight")\n'
              "            else value.clone() for name, value in weights.items()}")

MUTANTS = {
    "nb03-10": [  # block_local_ceiling
        ("calls the kit: mechanisms.bcmt.block_local_layer_flops for the block-local layer",
         "local = n_layer * (24 * d_model**2 + 2 * block_size * d_model) + head",
         "local = n_layer * mechanisms.bcmt.block_local_layer_flops(d_model, block_size) + head"),
        ("the LM head forgotten",
         "head = 2 * d_model * vocab_size", "head = 0"),
        ("ratio inverted (local / dense)",
         "return dense / local", "return local / dense"),
        ("dense attention term without its factor 2",
         "2 * seq_len * d_model", "seq_len * d_model"),
        ("12 d^2 instead of 24 d^2 per layer",
         "dense = n_layer * (24 * d_model**2 + 2 * seq_len * d_model) + head\n"
         "    local = n_layer * (24 * d_model**2 + 2 * block_size * d_model) + head",
         "dense = n_layer * (12 * d_model**2 + 2 * seq_len * d_model) + head\n"
         "    local = n_layer * (12 * d_model**2 + 2 * block_size * d_model) + head"),
        ("local context = number of blocks instead of the block size",
         "2 * block_size * d_model", "2 * (seq_len // block_size) * d_model"),
        ("the head counted once per layer",
         "dense = n_layer * (24 * d_model**2 + 2 * seq_len * d_model) + head\n"
         "    local = n_layer * (24 * d_model**2 + 2 * block_size * d_model) + head",
         "dense = n_layer * (24 * d_model**2 + 2 * seq_len * d_model + head)\n"
         "    local = n_layer * (24 * d_model**2 + 2 * block_size * d_model + head)"),
    ],
    "nb03-ablation-check": [  # without_memory
        ("zeroes the memory's gate weights instead of W_p (G = sigmoid(b_g) is not 0)",
         'name.endswith("memory_proj.weight")',
         'name.endswith("gate.weight") and ".mlp." not in name'),
        ("zeroes every weight named gate, the MLP's gate included",
         'name.endswith("memory_proj.weight")', '"gate" in name'),
        ("switches off the first layer's memory only",
         'name.endswith("memory_proj.weight")', 'name == "blocks.0.memory_proj.weight"'),
        ("sets alpha to 0 (the memory still reads the block before)",
         'name.endswith("memory_proj.weight")', 'name.endswith("alpha")'),
        ("zeroes the summary scores (each block's plain mean is still a memory)",
         'name.endswith("memory_proj.weight")', '".score." in name'),
        ("W_p set to ones instead of zeros",
         "torch.zeros_like(value)", "torch.ones_like(value)"),
        ("changes the weights it was given in place (a state_dict shares the model's tensors)",
         OFF_RETURN,
         "for name, value in weights.items():\n"
         "        if name.endswith(\"memory_proj.weight\"):\n"
         "            value.zero_()\n"
         "    return weights"),
        ("drops W_p from the dict (a BCMT cannot load it)",
         OFF_RETURN,
         'return {name: value.clone() for name, value in weights.items()\n'
         '            if not name.endswith("memory_proj.weight")}'),
    ],
    "nb03-22": [  # key_in_query_block
        ("first key token off by one",
         "- distance + 1", "- distance"),
        ("last answer position off by one (seq_len instead of seq_len - 1)",
         "== (seq_len - 1) // block_size", "== seq_len // block_size"),
        ("key length forgotten",
         "first_key = seq_len - key_len - distance + 1", "first_key = seq_len - distance + 1"),
        ("compares the distance with the block size, not the blocks",
         "return first_key // block_size == (seq_len - 1) // block_size",
         "return distance < block_size"),
        ("compares the last key token instead of the first",
         "first_key = seq_len - key_len - distance + 1", "first_key = seq_len - distance"),
    ],
    "nb03-33": [  # MyBCMTLayer, the capstone
        ("calls the kit: bcmt.shift_one_block for the shift",
         "earlier = torch.cat([memories.new_zeros(b, 1, d), memories[:, :-1]], dim=1)",
         "earlier = bcmt.shift_one_block(memories)"),
        ("memory shifted the wrong way: block i reads M_{i+1}",
         "earlier = torch.cat([memories.new_zeros(b, 1, d), memories[:, :-1]], dim=1)",
         "earlier = torch.cat([memories[:, 1:], memories.new_zeros(b, 1, d)], dim=1)"),
        ("no shift: block i reads M_i, which summarises its own future tokens",
         "earlier = torch.cat([memories.new_zeros(b, 1, d), memories[:, :-1]], dim=1)",
         "earlier = memories"),
        ("summary softmax over the blocks instead of within a block",
         "self.score(u_bar)[..., 0].softmax(dim=-1)", "self.score(u_bar)[..., 0].softmax(dim=1)"),
        ("gate missing: V = U + P",
         "v = u + g * p", "v = u + p"),
        ("memory dropped: V = U (HOnly)",
         "v = u + g * p", "v = u"),
        ("decay weights not normalised (rows do not sum to 1)",
         "(decay / decay.sum(dim=1, keepdim=True))", "decay"),
        ("decay normalised over the wrong axis",
         "decay.sum(dim=1, keepdim=True)", "decay.sum(dim=0, keepdim=True)"),
        ("decay on the future blocks (lag sign flipped)",
         "torch.where(lag >= 0,", "torch.where(lag <= 0,"),
        ("P tiled over the sequence instead of repeated within each block",
         ".repeat_interleave(size, dim=1)", ".repeat(1, size, 1)"),
        ("summaries of U instead of RMSNorm_s(U)",
         "summaries = (pi[..., None] * u_bar).sum(dim=2)",
         "summaries = (pi[..., None] * u.view(b, n, size, d)).sum(dim=2)"),
        ("dense causal attention instead of block-local",
         "mask=block_causal_mask(t, size, x.device)", "mask=None"),
        ("no RMSNorm before the local attention",
         "self.attn(self.norm1(x), positions,", "self.attn(x, positions,"),
    ],
}

CHEATS = {
    "nb03-22": [  # key_in_query_block: the check's reference is importable from its module
        ("the check's truth_from_rows, which the notebook imports for the cell after it",
         "return first_key // block_size == (seq_len - 1) // block_size",
         "from blockmem_lite.exercise_checks.nb03 import truth_from_rows\n"
         "    return truth_from_rows(distance, seq_len, block_size, key_len)"),
    ],
}
