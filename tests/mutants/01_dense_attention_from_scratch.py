"""Planted wrong answers for notebooks/solutions/01_dense_attention_from_scratch.ipynb.

MUTANTS: check cell id -> [(description, original text in the solution region, replacement)].
tests/test_mutants.py substitutes each one and proves the check cell rejects it.
"""

MUTANTS = {
    "nb01-05": [  # my_causal_mask
        ("strict <: a query may not see its own key",
         "return k_pos <= q_pos", "return k_pos < q_pos"),
        ("comparison the wrong way round: sees the future, not the past",
         "return k_pos <= q_pos", "return k_pos >= q_pos"),
        ("off by one: sees one key in the future",
         "return k_pos <= q_pos", "return k_pos <= q_pos + 1"),
        ("forgets the cache offset: queries counted from 0, not the last q_len positions",
         "return k_pos <= q_pos", "return k_pos <= q_pos - (kv_len - q_len)"),
        ("transposed mask",
         "return k_pos <= q_pos", "return (k_pos <= q_pos).T"),
        ("calls the kit's causal_mask",
         "return k_pos <= q_pos", "return causal_mask(q_len, kv_len)"),
    ],
    "nb01-08": [  # masked_attention for a padded batch
        ("missing 1/sqrt(hd) scaling",
         "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])",
         "scores = q @ k.transpose(-2, -1)"),
        ("softmax over the queries instead of the keys",
         "scores.softmax(dim=-1)", "scores.softmax(dim=-2)"),
        ("mask not inverted: hides the allowed keys",
         'scores.masked_fill(~per_head, float("-inf"))',
         'scores.masked_fill(per_head, float("-inf"))'),
        ("masked scores set to 0 instead of -inf",
         'scores.masked_fill(~per_head, float("-inf"))', "scores.masked_fill(~per_head, 0.0)"),
        ("mask broadcast over the wrong dimension (sequence b's mask on head b)",
         "per_head = mask[:, None]", "per_head = mask[None]"),
        ("a row with no allowed key left as NaN",
         "scores.softmax(dim=-1).nan_to_num(0.0)", "scores.softmax(dim=-1)"),
        ("scaled by sqrt(number of keys) instead of sqrt(head dim)",
         "math.sqrt(q.shape[-1])", "math.sqrt(k.shape[-2])"),
        ("calls the kit's reference_attention, one sequence at a time",
         "return weights @ v, weights",
         "return torch.cat([reference_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], mask[b])[0]"
         " for b in range(q.shape[0])]).nan_to_num(0.0), weights"),
    ],
    "nb01-11": [  # decode_step
        ("readout excludes the current slot (:t instead of :t + 1)",
         "scores = q @ cache_k[:, :, :t + 1].transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
         "    y = scores.softmax(dim=-1) @ cache_v[:, :, :t + 1]",
         "scores = q @ cache_k[:, :, :t].transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
         "    y = scores.softmax(dim=-1) @ cache_v[:, :, :t]"),
        ("stale value cache: the value is never stored",
         "    cache_v[:, :, t:t + 1] = v\n", ""),
        ("attends over every slot, including the empty future ones",
         "scores = q @ cache_k[:, :, :t + 1].transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
         "    y = scores.softmax(dim=-1) @ cache_v[:, :, :t + 1]",
         "scores = q @ cache_k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
         "    y = scores.softmax(dim=-1) @ cache_v"),
        ("writes one slot late (t + 1), reads the stale slot t",
         "cache_k[:, :, t:t + 1] = k\n    cache_v[:, :, t:t + 1] = v",
         "cache_k[:, :, t + 1:t + 2] = k\n    cache_v[:, :, t + 1:t + 2] = v"),
        ("missing 1/sqrt(hd) scaling",
         ".transpose(-2, -1) / math.sqrt(q.shape[-1])", ".transpose(-2, -1)"),
        ("softmax over the (single) query axis",
         "y = scores.softmax(dim=-1)", "y = scores.softmax(dim=-2)"),
        ("calls the kit's attention for the readout",
         "scores = q @ cache_k[:, :, :t + 1].transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
         "    y = scores.softmax(dim=-1) @ cache_v[:, :, :t + 1]",
         "y = attention(q, cache_k[:, :, :t + 1], cache_v[:, :, :t + 1])"),
    ],
    "nb01-14": [  # kv_cache_bytes
        ("forgets the values: keys only",
         "return 2 * batch * t", "return batch * t"),
        ("forgets the layers",
         "* d_model * n_layer *", "* d_model *"),
        ("forgets the batch",
         "return 2 * batch * t", "return 2 * t"),
        ("bits instead of bytes",
         "* bytes_per_number", "* bytes_per_number * 8"),
        ("calls the kit's state_bytes (one fp32 sequence) and scales it",
         "return 2 * batch * t * d_model * n_layer * bytes_per_number",
         "return int(registry.get('dense').state_bytes(ModelConfig(d_model=d_model, "
         "n_layer=n_layer, n_head=1), t) * batch * bytes_per_number / 4)"),
    ],
    "nb01-19": [  # attention_without_mask + predicted_changed_positions
        ("attention_without_mask: softmax over the queries",
         ".softmax(dim=-1)", ".softmax(dim=-2)"),
        ("attention_without_mask: missing 1/sqrt(hd) scaling",
         "(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))", "(q @ k.transpose(-2, -1))"),
        ("attention_without_mask calls the library's causal attention",
         "return weights @ v", "return attention(q, k, v, causal=True)"),
        ("attention_without_mask calls the kit's reference_attention (right values)",
         "return weights @ v", "return reference_attention(q, k, v)[0]"),
        ("off by one: the changed token's own output predicted unchanged",
         "list(range(changed_at, seq_len)) if causal",
         "list(range(changed_at + 1, seq_len)) if causal"),
        ("the two cases swapped",
         "if causal else", "if not causal else"),
        ("without the mask: only the positions up to the change predicted to move",
         "else list(range(seq_len))", "else list(range(changed_at + 1))"),
        ("without the mask: the same positions predicted as with it",
         "else list(range(seq_len))", "else list(range(changed_at, seq_len))"),
    ],
}
