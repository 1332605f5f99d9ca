"""Planted wrong answers for notebooks/solutions/04_cat_compress_and_attend.ipynb.

MUTANTS: check cell id -> [(description, original text in the solution region, replacement)].
tests/test_mutants.py substitutes each one and proves the check cell rejects it.
"""

MUTANTS = {
    "nb04-05": [  # allowed (the CAT mask)
        ("strict n < q: a slot may not see itself",
         "return (n <= q) &", "return (n < q) &"),
        ("no causality at all",
         "return (n <= q) & (same_group | is_vector)", "return same_group | is_vector"),
        ("groups of chunk_size slots: the vector slot left out of the width",
         "same_group = (q // width) == (n // width)",
         "same_group = (q // (width - 1)) == (n // (width - 1))"),
        ("the vector is the group's last slot instead of its first",
         "is_vector = (n % width) == 0", "is_vector = (n % width) == width - 1"),
        ("missing parentheses: future vector slots visible",
         "return (n <= q) & (same_group | is_vector)", "return (n <= q) & same_group | is_vector"),
        ("calls the kit's masks.cat_mask (the layout read back from S and W)",
         "    same_group = (q // width) == (n // width)\n"
         "    is_vector = (n % width) == 0\n"
         "    return (n <= q) & (same_group | is_vector)\n",
         "    s = q.numel()\n"
         "    separator = (s - 2) % width == 0         # S = K*W + 2 with SEP, K*W + 1 without\n"
         "    return cat_mask((s - 1 - separator) // width, width - 1 - separator, separator)\n"),
    ],
    "nb04-08": [  # fixed_readout
        ("the SEP offset forgotten",
         "next_group = (k + 1) * width + (1 if separator else 0)",
         "next_group = (k + 1) * width"),
        ("the first token of a chunk jumps instead of the last",
         "torch.where(j == chunk_size - 1,", "torch.where(j == 0,"),
        ("next group read one slot late",
         "next_group = (k + 1) * width +", "next_group = (k + 1) * width + 1 +"),
        ("reads its own group's vector slot (k * width)",
         "next_group = (k + 1) * width +", "next_group = k * width +"),
        ("the colleague's bug again: every token reads its own slot",
         "return torch.where(j == chunk_size - 1, next_group, own)", "return own"),
        ("calls the kit's cat_layout.readout_slots",
         "    next_group = (k + 1) * width + (1 if separator else 0)\n"
         "    return torch.where(j == chunk_size - 1, next_group, own)\n",
         "    return cat_layout.readout_slots(n_chunks, chunk_size, separator, device)\n"),
    ],
    "nb04-11": [  # cat_pairs + dense_pairs
        ("the closing vector slot forgotten",
         "for k in range(n_chunks + 1))", "for k in range(n_chunks))"),
        ("a token does not count the pair with itself",
         "(k + 1) + (j + 1) for k", "(k + 1) + j for k"),
        ("a token sees k vector slots instead of k + 1",
         "sum((k + 1) + (j + 1)", "sum(k + (j + 1)"),
        ("dense pairs without the diagonal",
         "seq_len * (seq_len + 1) // 2", "seq_len * (seq_len - 1) // 2"),
        ("dense pairs without the causal mask",
         "return seq_len * (seq_len + 1) // 2", "return seq_len * seq_len"),
        ("builds the mask after all: counts cat_mask's True entries",
         "    return vectors + tokens\n", "    return int(cat_mask(n_chunks, chunk_size).sum())\n"),
        ("calls the kit: masks.cat_pair_count, which counts the pairs from the mask's rule",
         "    return vectors + tokens\n",
         "    from blockmem_lite.masks import cat_pair_count\n"
         "    return cat_pair_count(n_chunks, chunk_size)\n"),
    ],
    "nb04-15": [  # first_leak + leak_reaches
        ("first leak one position late",
         "first_leak = 0", "first_leak = 1"),
        ("first leak at the end of the chunk",
         "first_leak = 0", "first_leak = 3"),
        ("leak reaches one token too far",
         "leak_reaches = 3", "leak_reaches = 4"),
        ("leak reaches the whole sequence",
         "leak_reaches = 3", "leak_reaches = 15"),
        ("leak reaches the end of the next chunk",
         "leak_reaches = 3", "leak_reaches = 7"),
    ],
}

_REDEFINE = "return None\n\n\n"          # ends the original body; what follows is top level
CHEATS = {
    "nb04-05": [  # allowed
        ("the kit's cat_mask reached through a default argument, the layout read back from S "
         "and W",
         "return (n <= q) & (same_group | is_vector)",
         _REDEFINE + "def allowed(q, n, width, _kit=cat_mask):\n"
         "    s = q.numel()\n    separator = (s - 2) % width == 0\n"
         "    return _kit((s - 1 - separator) // width, width - 1 - separator, separator)"),
    ],
    "nb04-11": [  # cat_pairs
        ("hard-coded: the kit's counts for the check's fixed cases, kept before it runs",
         "return vectors + tokens",
         _REDEFINE + "_KNOWN = {kc: int(cat_mask(*kc).sum()) for kc in "
         "[(1, 1), (3, 4), (8, 16), (16, 2), (4096 // 64, 64)]}\n\n\n"
         "def cat_pairs(n_chunks, chunk_size):\n    return _KNOWN.get((n_chunks, chunk_size), 0)"),
        ("the kit's cat_mask counted, reached through a default argument",
         "return vectors + tokens",
         _REDEFINE + "def cat_pairs(n_chunks, chunk_size, _kit=cat_mask):\n"
         "    return int(_kit(n_chunks, chunk_size).sum())"),
    ],
}
