"""Planted wrong answers for notebooks/solutions/03_bcmt_training_vs_dense.ipynb.

MUTANTS: check cell id -> [(description, original text in the solution region, replacement)].
tests/test_mutants.py substitutes each one and proves the check cell rejects it.
"""

MUTANTS = {
    "nb03-05": [  # dense_state_bytes + bcmt_state_bytes
        ("dense: keys only, the values forgotten",
         "return 2 * batch * t * d_model * n_layer", "return batch * t * d_model * n_layer"),
        ("dense: the layers forgotten",
         "return 2 * batch * t * d_model * n_layer", "return 2 * batch * t * d_model"),
        ("bcmt: the block cache holds keys only",
         "per_layer = 2 * block_size * d_model +", "per_layer = block_size * d_model +"),
        ("bcmt: the memory state (3 d + 3 numbers) dropped",
         "per_layer = 2 * block_size * d_model + 3 * d_model + 3",
         "per_layer = 2 * block_size * d_model"),
        ("bcmt: the 3 scalars per layer dropped",
         "+ 3 * d_model + 3", "+ 3 * d_model"),
        ("bcmt: the batch forgotten",
         "return batch * n_layer * per_layer", "return n_layer * per_layer"),
    ],
    "nb03-10": [  # block_local_ceiling
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
    ],
    "nb03-16": [  # decay_weights_limit
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
    ],
}
