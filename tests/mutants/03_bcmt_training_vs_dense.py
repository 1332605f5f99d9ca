"""Planted wrong answers for notebooks/solutions/03_bcmt_training_vs_dense.ipynb.

MUTANTS: check cell id -> [(description, original text in the solution region, replacement)].
tests/test_mutants.py substitutes each one and proves the check cell rejects it.
"""

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
    "nb03-16": [  # decay_weights_limit
        ("calls the kit: decay_weights at alpha = 0",
         "return torch.eye(n_blocks)", "return decay_weights(n_blocks, 0.0)"),
        ("alpha = 0 keeps nothing (zeros)",
         "return torch.eye(n_blocks)", "return torch.zeros(n_blocks, n_blocks)"),
        ("alpha = 0 keeps the oldest summary instead of the newest",
         "return torch.eye(n_blocks)",
         "return torch.zeros(n_blocks, n_blocks).index_fill(1, torch.tensor([0]), 1.0)"),
        ("alpha = 1: missing normalisation",
         "return lower / lower.sum(dim=-1, keepdim=True)", "return lower"),
        ("alpha = 1: upper triangle (future summaries)",
         ".tril()", ".triu()"),
        ("alpha = 1: normalised over the wrong axis",
         "lower.sum(dim=-1, keepdim=True)", "lower.sum(dim=-2, keepdim=True)"),
        ("alpha = 1: the diagonal left out (a block does not weigh its own summary)",
         ".tril()", ".tril(-1)"),
        ("alpha = 0 predicted as the previous block (the shift folded into W)",
         "return torch.eye(n_blocks)", "return torch.ones(n_blocks - 1).diag(-1)"),
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
