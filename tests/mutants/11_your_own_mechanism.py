"""Planted wrong answers for notebooks/solutions/11_your_own_mechanism.ipynb.

MUTANTS: check cell id -> [(description, original text in the solution region, replacement)].
tests/test_mutants.py substitutes each one and proves the check cell rejects it.
"""

MUTANTS = {
    "cell-8": [  # dilated_window_mask
        ("off by one: W + 1 keys (<=)",
         "(lag < window * dilation)", "(lag <= window * dilation)"),
        ("window counted in positions, not dilated steps",
         "(lag < window * dilation)", "(lag < window)"),
        ("causality dropped: future multiples of the dilation visible",
         "return (lag >= 0) & ", "return "),
        ("multiples of the dilation in absolute key positions, not lags",
         "(lag % dilation == 0)", "(k_pos % dilation == 0)"),
        ("lag the wrong way round (k - q)",
         "lag = q_pos - k_pos\n    return", "lag = k_pos - q_pos\n    return"),
    ],
    "cell-12": [  # sink_window_mask + sink_keys_per_query
        ("the sink is the last key instead of key 0",
         "| (k_pos == 0)", "| (k_pos == kv_len - 1)"),
        ("no sink at all",
         " | (k_pos == 0)", ""),
        ("sink broadcast over the wrong dimension (query 0 sees every key)",
         "| (k_pos == 0)", "| (k_pos.T == 0)"),
        ("the sink always counted as an extra key",
         "+ (1 if t >= window else 0)", "+ 1"),
        ("off by one: sink extra only from t > W",
         "(1 if t >= window else 0)", "(1 if t > window else 0)"),
        ("window keys off by one: min(t, W)",
         "min(t + 1, window) +", "min(t, window) +"),
    ],
    "cell-16": [  # predicted_ceiling
        ("window attention at 2 d per key instead of 4 d",
         "4 * d * keys", "2 * d * keys"),
        ("the warm-up correction dropped: W keys from the start",
         "else window - window ** 2 / (2 * seq_len)", "else window"),
        ("the LM head forgotten",
         "dense = n_layer * (24 * d * d + 2 * seq_len * d) + 2 * d * vocab\n"
         "    swa = n_layer * (24 * d * d + 4 * d * keys) + 2 * d * vocab",
         "dense = n_layer * (24 * d * d + 2 * seq_len * d)\n"
         "    swa = n_layer * (24 * d * d + 4 * d * keys)"),
        ("ratio inverted (swa / dense)",
         "return dense / swa", "return swa / dense"),
        ("short sequences: T keys instead of T / 2 on average",
         "keys = seq_len / 2 if seq_len <= window", "keys = seq_len if seq_len <= window"),
    ],
    "cell-22": [  # chunked_window_attention
        ("chunk 0's padding keys not blocked",
         "    mask[0, :, :window] = False                                  # chunk 0: the padding\n",
         ""),
        ("the next chunk instead of the previous one (future leak)",
         "F.pad(z, (0, 0, 0, 0, 1, 0))[:, :, :-1]", "F.pad(z, (0, 0, 0, 0, 0, 1))[:, :, 1:]"),
        ("causal mask over both chunks instead of the window",
         "masks.sliding_window_mask(window, 2 * window, window=window)",
         "masks.causal_mask(window, 2 * window)"),
        ("the previous chunk's keys dropped (zeros)",
         "torch.cat([previous, z], dim=3)", "torch.cat([torch.zeros_like(previous), z], dim=3)"),
        ("keys concatenated in the wrong order (current chunk first)",
         "torch.cat([previous, z], dim=3)", "torch.cat([z, previous], dim=3)"),
    ],
}
