"""CAT's interleaved mask against a brute force from the slot rules (docs/PAPERS.md, CAT
equations)."""

import pytest
import torch

from blockmem_lite.masks import cat_mask, cat_pair_count


def _slot_roles(n_chunks, chunk_size, separator):
    """Each slot as ("f", k) for the compressed slot opening group k, ("sep", k), or ("tok", k, j)."""
    roles = []
    for k in range(n_chunks + 1):
        roles.append(("f", k))
        if separator:
            roles.append(("sep", k))
        if k < n_chunks:
            roles += [("tok", k, j) for j in range(chunk_size)]
    return roles


def _may_see(query, key):
    """The semantics in words: compressed slots are public from where they stand on;
    everything else (tokens, SEP) is private to its group and causal inside it."""
    q_group, k_group = query[1], key[1]
    if key[0] == "f":                      # f_{k-1} (or the dummy) at the head of group k
        return k_group <= q_group
    if q_group != k_group:
        return False
    if key[0] == "sep":
        return query[0] != "f"
    # key is a token (k, j): seen by later tokens of its own chunk only
    return query[0] == "tok" and query[2] >= key[2]


@pytest.mark.parametrize("separator", [False, True])
@pytest.mark.parametrize("n_chunks, chunk_size", [(1, 1), (2, 4), (3, 2), (5, 8), (4, 1)])
def test_c1_mask_equals_brute_force(n_chunks, chunk_size, separator):
    roles = _slot_roles(n_chunks, chunk_size, separator)
    expected = torch.tensor([[_may_see(q, k) for k in roles] for q in roles])
    assert torch.equal(cat_mask(n_chunks, chunk_size, separator), expected)


def test_tokens_never_see_earlier_chunks_raw_tokens():
    m = cat_mask(3, 4)                     # W = 5: token (1, 0) is slot 6, token (0, 3) slot 4
    assert not m[6, 4]
    assert m[6, 5] and m[6, 0]             # f_0 and the dummy are visible
    assert m.diagonal().all()


def test_cat_mask_errors_name_the_parameter():
    with pytest.raises(ValueError, match="chunk_size=0"):
        cat_mask(2, 0)
    with pytest.raises(ValueError, match="n_chunks"):
        cat_mask(0, 4)


@pytest.mark.parametrize("separator", [False, True])
@pytest.mark.parametrize("n_chunks, chunk_size", [(1, 1), (2, 4), (3, 2), (5, 8), (16, 16)])
def test_cat_pair_count_equals_the_masks_allowed_pairs(n_chunks, chunk_size, separator):
    expected = int(cat_mask(n_chunks, chunk_size, separator).sum())
    assert cat_pair_count(n_chunks, chunk_size, separator) == expected


@pytest.mark.parametrize("n_chunks, chunk_size", [(16, 16), (64, 64), (32, 128), (128, 32)])
def test_cat_pair_count_is_about_t_times_c_half_plus_k_half(n_chunks, chunk_size):
    """A token of chunk k sees k + 1 vectors and j + 1 tokens of its chunk: on average about
    C/2 + K/2 keys, T (C/2 + K/2) in all. The exact count adds T (the averages are (C + 1)/2
    and (K + 1)/2) and the K + 1 vector slots' own rows, (K + 1)(K + 2)/2: a few percent."""
    t = n_chunks * chunk_size
    approx = t * (chunk_size / 2 + n_chunks / 2)
    exact = cat_pair_count(n_chunks, chunk_size)
    assert exact - approx == t + (n_chunks + 1) * (n_chunks + 2) / 2
    assert exact / approx < 1.1


def test_cat_pair_count_at_4096_tokens():
    """Dense causal attention over T = 4096 tokens does about 31x CAT's pairs at C = 64, and
    among the chunk sizes that divide T the count is smallest at C = sqrt(T) = 64."""
    t = 4096
    counts = {c: cat_pair_count(t // c, c) for c in (8, 16, 32, 64, 128, 256, 512)}
    assert counts[64] == 268_385
    assert round(t * (t + 1) // 2 / counts[64], 1) == 31.3
    assert min(counts, key=counts.get) == 64
    with pytest.raises(ValueError, match="chunk_size=0"):
        cat_pair_count(2, 0)
