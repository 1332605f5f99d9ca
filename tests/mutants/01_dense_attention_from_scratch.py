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

# Cheating mutants: answers that are not the learner's own. Each replaces the answer's last line
# and, where the route needs it, redefines the function after it at the top level of its cell.
_REDEFINE = "return None\n\n\n"          # ends the original body; what follows is top level
_MASK = "return k_pos <= q_pos"
CHEATS = {
    "nb01-05": [  # my_causal_mask: every route to the kit's causal_mask
        ("getattr on importlib.import_module, the name built at run time",
         _MASK, "import importlib\n    return getattr(importlib.import_module("
                "'blockmem_lite.masks'), 'causal_' + 'mask')(q_len, kv_len)"),
        ("eval of the name", _MASK, "return eval('causal' + '_mask')(q_len, kv_len)"),
        ("kept in a dict",
         _MASK, _REDEFINE + "_KEPT = {'mask': causal_mask}\n\n\n"
                "def my_causal_mask(q_len, kv_len):\n    return _KEPT['mask'](q_len, kv_len)"),
        ("a default argument",
         _MASK, _REDEFINE + "def my_causal_mask(q_len, kv_len, _mask=causal_mask):\n"
                "    return _mask(q_len, kv_len)"),
        ("a class attribute",
         _MASK, _REDEFINE + "class _Holder:\n    mask = staticmethod(causal_mask)\n\n\n"
                "def my_causal_mask(q_len, kv_len):\n    return _Holder.mask(q_len, kv_len)"),
        ("types.FunctionType from the kit's __code__",
         _MASK, _REDEFINE + "import types\n_copy = types.FunctionType(causal_mask.__code__, "
                "causal_mask.__globals__, 'c', causal_mask.__defaults__)\n\n\n"
                "def my_causal_mask(q_len, kv_len):\n    return _copy(q_len, kv_len)"),
        ("the kit's source compiled again under another name, as the answer",
         _MASK, _REDEFINE + "import inspect\n_ns = {}\nexec(inspect.getsource(causal_mask)"
                ".replace('def causal_mask', 'def my_causal_mask'), dict(causal_mask.__globals__),"
                " _ns)\nmy_causal_mask = _ns['my_causal_mask']"),
        ("the kit's source compiled again, called from the answer",
         _MASK, _REDEFINE + "import inspect\n_ns = {}\nexec(inspect.getsource(causal_mask), "
                "dict(causal_mask.__globals__), _ns)\n\n\n"
                "def my_causal_mask(q_len, kv_len):\n    return _ns['causal_mask'](q_len, kv_len)"),
        ("a decorator that looks the kit's function up at call time",
         _MASK, _REDEFINE + "def _looked_up(fn):\n    def wrapper(q_len, kv_len):\n"
                "        return globals()['causal' + '_mask'](q_len, kv_len)\n    return wrapper\n"
                "\n\n@_looked_up\ndef my_causal_mask(q_len, kv_len):\n    return None"),
        ("the refusal caught and the kit called again",
         _MASK, _REDEFINE + "_KEPT = [causal_mask]\n\n\ndef my_causal_mask(q_len, kv_len):\n"
                "    try:\n        return _KEPT[0](q_len, kv_len)\n    except Exception:\n"
                "        return _KEPT[0](q_len, kv_len)"),
        ("the check's profiler switched off first",
         _MASK, _REDEFINE + "import sys as _sys\n_KEPT = [causal_mask]\n\n\n"
                "def my_causal_mask(q_len, kv_len, _off=_sys.setprofile):\n    _off(None)\n"
                "    return _KEPT[0](q_len, kv_len)"),
        ("hard-coded: the kit's answers for the check's fixed cases, kept before it runs",
         _MASK, _REDEFINE + "_KNOWN = {qk: causal_mask(*qk) for qk in [(6, 6), (3, 8), (1, 5)]}"
                "\n\n\ndef my_causal_mask(q_len, kv_len):\n    return _KNOWN.get((q_len, kv_len),"
                " torch.ones(q_len, kv_len, dtype=torch.bool))"),
        ("a wrong answer, and the check helper redefined to print OK",
         _MASK, "return k_pos < q_pos\n\n\ndef check_equal(*args, **kwargs):\n    print('OK')"),
        ("the kit's function, and own_work's bytecode reader patched to see nothing",
         _MASK, "return causal_mask(q_len, kv_len)\n\n\nimport blockmem_lite.own_work as _ow\n"
                "_ow._calls_into = lambda *args: None"),
        ("a wrong answer, and a custom exception handler that hides the failure",
         _MASK, "return k_pos < q_pos\n\n\n"
                "get_ipython().set_custom_exc((Exception,), lambda *args, **kwargs: None)"),
        ("a wrong answer, and an input transformer that empties the check cell",
         _MASK, "return k_pos < q_pos\n\n\n"
                "get_ipython().input_transformers_post.append(lambda lines: ['pass\\n'])"),
        ("a wrong answer, and a post-run callback that clears the error output",
         _MASK, "return k_pos < q_pos\n\n\nfrom IPython.display import clear_output\n"
                "get_ipython().events.register('post_run_cell', lambda result: clear_output())"),
    ],
    "nb01-08": [  # masked_attention: "by hand"
        ("torch's scaled_dot_product_attention instead of attention by hand",
         "return weights @ v, weights",
         "out = F.scaled_dot_product_attention(q, k, v, attn_mask=per_head).nan_to_num(0.0)\n"
         "    return torch.where(~per_head.any(-1, keepdim=True), 0.0, out), weights"),
        ("scaled_dot_product_attention kept in a default argument",
         "return weights @ v, weights",
         "return _sdpa_output(q, k, v, per_head), weights\n\n\n"
         "def _sdpa_output(q, k, v, per_head, _sdpa=F.scaled_dot_product_attention):\n"
         "    out = _sdpa(q, k, v, attn_mask=per_head).nan_to_num(0.0)\n"
         "    return torch.where(~per_head.any(-1, keepdim=True), 0.0, out)"),
    ],
}
