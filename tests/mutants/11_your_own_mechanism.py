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
        ("calls the kit's sliding_window_mask for the reach (right values)",
         "return (lag >= 0) & (lag % dilation == 0) & (lag < window * dilation)",
         "return masks.sliding_window_mask(q_len, kv_len, window=(window - 1) * dilation + 1) "
         "& (lag % dilation == 0)"),
    ],
    "cell-12": [  # sink_window_mask + sink_keys_per_query
        ("the sinks are the last keys instead of the first",
         "(k_pos < sinks)", "(k_pos >= kv_len - sinks)"),
        ("no sinks at all",
         " | sink", ""),
        ("a sink visible to the queries before it (future leak)",
         "sink = (k_pos < sinks) & (k_pos <= q_pos)", "sink = k_pos < sinks"),
        ("one sink too many (<=)",
         "(k_pos < sinks)", "(k_pos <= sinks)"),
        ("sinks broadcast over the wrong dimension (queries instead of keys)",
         "(k_pos < sinks)", "(k_pos.T[:q_len] < sinks)"),
        ("the sinks always counted as extra keys",
         "max(0, min(sinks, t - window + 1))", "sinks"),
        ("off by one: a sink counted extra only from t > W",
         "t - window + 1))", "t - window))"),
        ("window keys off by one: min(t, W)",
         "min(t + 1, window) +", "min(t, window) +"),
        ("the number of sinks not capped",
         "max(0, min(sinks, t - window + 1))", "max(0, t - window + 1)"),
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
        ("calls the kit's flop_ceiling for the ratio",
         "return dense / swa", "return flop_ceiling(dense, swa)"),
        ("short sequences: T keys instead of T / 2 on average",
         "keys = seq_len / 2 if seq_len <= window", "keys = seq_len if seq_len <= window"),
        ("the LM head counted in the dense cost only",
         "swa = n_layer * (24 * d * d + 4 * d * keys) + 2 * d * vocab",
         "swa = n_layer * (24 * d * d + 4 * d * keys)"),
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
        ("calls the kit's reference_attention with the full mask",
         "return y.reshape(b, h, t, d)",
         "return reference_attention(q, k, v, mask=sliding(t, t, window))[0]"),
        ("one T x T masked SDPA call instead of chunks (right values, no saving)",
         "return y.reshape(b, h, t, d)",
         "return F.scaled_dot_product_attention(q, k, v, attn_mask=sliding(t, t, window))"),
    ],
}

_REDEFINE = "return None\n\n\n"          # ends the original body; what follows is top level
CHEATS = {
    "cell-8": [  # dilated_window_mask
        ("the check's own brute force imported from its module and called",
         "return (lag >= 0) & (lag % dilation == 0) & (lag < window * dilation)",
         "from blockmem_lite.exercise_checks.nb11 import brute_force_dilated\n"
         "    return brute_force_dilated(q_len, kv_len, window, dilation)"),
        ("hard-coded: the brute force's answers for the check's fixed cases, kept in advance",
         "return (lag >= 0) & (lag % dilation == 0) & (lag < window * dilation)",
         "return (lag >= 0) & (lag % dilation == 0) & (lag < window * dilation) if (q_len, kv_len,"
         " window, dilation) in {(24, 24, 4, 3), (24, 24, 5, 1), (3, 30, 4, 2), (16, 16, 1, 4), "
         "(20, 20, 6, 2), (30, 30, 4, 3)} else torch.ones(q_len, kv_len, dtype=torch.bool)"),
    ],
    "cell-12": [  # sink_window_mask + sink_keys_per_query
        ("the check's own brute force looked up in its module at call time",
         "return masks.sliding_window_mask(q_len, kv_len, window=window) | sink",
         "return getattr(importlib.import_module('blockmem_lite.exercise_checks.nb11'),\n"
         "                   'brute_force_' + 'sinks')(q_len, kv_len, window, sinks)"),
        ("the keys per query counted from the check's brute force",
         "return min(t + 1, window) + max(0, min(sinks, t - window + 1))",
         "from blockmem_lite.exercise_checks.nb11 import brute_force_sinks\n"
         "    return int(brute_force_sinks(t + 1, t + 1, window, sinks)[-1].sum())"),
    ],
    "cell-16": [  # predicted_ceiling
        ("dense's FLOP model reached through the registry, not predicted",
         "return dense / swa",
         "from blockmem_lite import registry as _r\n"
         "    from blockmem_lite.config import ModelConfig as _M\n"
         "    sizes = dict(d_model=d, n_layer=n_layer, n_head=4, vocab_size=vocab, "
         "seq_len=seq_len)\n"
         "    return _r.get('dense').flops(_M(**sizes), seq_len) / "
         "_r.get('swa').flops(_M(arch='swa', window=window, **sizes), seq_len)"),
    ],
}
