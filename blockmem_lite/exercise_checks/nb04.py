"""The checks of exercises/04_cat_compress_and_attend.ipynb (see ``exercise_checks``)."""

from __future__ import annotations

import torch

from blockmem_lite.checks import CheckFailed, check_causal, check_equal, check_true
from blockmem_lite.config import ModelConfig
from blockmem_lite.exercise_checks import exercise_check
from blockmem_lite.masks import cat_mask, cat_pair_count
from blockmem_lite.models import build_model, cat
from blockmem_lite.ops import cat_layout
from blockmem_lite.own_work import check_prediction

# The notebook's small multi-chunk CAT (exercise 2) and the fixed-chunk one with the bug (4).
SMALL_CAT = ModelConfig(arch="cat", d_model=16, n_layer=2, n_head=2, seq_len=32, chunk_size=4,
                        chunk_sizes=(2, 4, 8))
FIXED_CAT = ModelConfig(arch="cat", d_model=16, n_layer=2, n_head=2, seq_len=32, chunk_size=4)


def small_cat(seed: int = 0) -> cat.CATLM:
    """The multi-chunk CAT of exercise 2, untrained, float64, its weights drawn from ``seed``
    (the global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model(SMALL_CAT).double().eval()


@exercise_check("nb04-05", own_work={"allowed": (cat_mask,)})
def allowed_check(t):
    """The whole mask from allowed(q, n, width) against cat_mask, with and without
    separators, on fixed layouts and one drawn anew."""
    allowed = t.answer("allowed")
    fresh = (t.fresh_int(1, 6), t.fresh_int(1, 9))
    for k, c in [(1, 1), (3, 4), (5, 2), (2, 8), fresh]:
        for sep in (False, True):
            width = cat_layout.group_width(c, sep)
            slots = torch.arange(cat_layout.n_slots(k, c, sep))
            check_equal(allowed(slots[:, None], slots[None, :], width), cat_mask(k, c, sep),
                        f"K={k}, C={c}, separator={sep}")


def readout_logits(t, weights: dict, tokens: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Where the answers live: the logits of the small multi-chunk CAT holding ``weights``
    with fixed_readout as its readout (a CATLM subclass), at ``chunk_size``."""
    fixed_readout = t.answer("fixed_readout")

    class FixedReadoutCAT(cat.CATLM):
        readout_slots = staticmethod(fixed_readout)

    model = FixedReadoutCAT(SMALL_CAT).double().eval()
    model.load_state_dict(weights)
    with torch.no_grad():
        return model(tokens, chunk_size=chunk_size).logits


@exercise_check("nb04-08", own_work={"fixed_readout": (cat_layout.readout_slots,)})
def fixed_readout_check(t):
    """fixed_readout against cat_layout.readout_slots (fixed layouts and one drawn anew), then
    check_causal at every chunk size on a multi-chunk CAT reading out through it."""
    fixed_readout = t.answer("fixed_readout")
    for k, c in [(3, 4), (2, 1), (4, 2), (t.fresh_int(1, 8), t.fresh_int(1, 9))]:
        for sep in (False, True):
            check_equal(fixed_readout(k, c, sep), cat_layout.readout_slots(k, c, sep),
                        f"fixed_readout K={k}, C={c}, separator={sep}")
    model = small_cat(t.fresh_int(0, 1 << 30))          # weights drawn anew
    weights = model.state_dict()
    tokens = torch.randint(0, 256, (1, 24), generator=t.fresh_generator())
    for c in model.chunk_sizes:
        check_causal(lambda x, c=c: t.remote(readout_logits, weights, x, c), tokens,
                     positions=sorted({c - 1, c, 2 * c - 1, 12}), vocab_size=256)


@exercise_check("nb04-11", own_work={"cat_pairs": (cat_mask, cat_pair_count)})
def pairs_check(t):
    """cat_pairs against cat_mask(K, C).sum() and dense_pairs against a causal mask's count
    (fixed sizes and one drawn anew), then the ratio at T = 4096, C = 64."""
    cat_pairs, dense_pairs = t.answer("cat_pairs"), t.answer("dense_pairs")
    for k, c in [(1, 1), (3, 4), (8, 16), (16, 2), (t.fresh_int(1, 20), t.fresh_int(1, 20))]:
        check_equal(cat_pairs(k, c), int(cat_mask(k, c).sum()), f"cat_pairs({k}, {c})")
        check_equal(dense_pairs(k * c), int(torch.ones(k * c, k * c).tril().sum()),
                    f"dense_pairs({k * c})")
    ratio = dense_pairs(4096) / cat_pairs(4096 // 64, 64)
    print(f"T=4096, C=64: dense does {ratio:.1f}x the attention pairs of CAT")
    check_true(30 < ratio < 33, "about 31x fewer pairs at T = 4096, C = 64")


def vector_inside_its_chunk(tokens, compressed, head, separator=None):
    """The bug: g_k = f_k (and the closing slot repeats f_{K-1})."""
    shifted = torch.cat([compressed[:, 1:], compressed[:, -1:]], dim=1)     # f_1..f_{K-1}, f_{K-1}
    return cat_layout.interleave(tokens, shifted, compressed[:, 0], separator)


class VectorInsideCAT(cat.CATLM):
    """A fixed-chunk CAT with the bug planted: each chunk's vector opens its own group."""

    interleave = staticmethod(vector_inside_its_chunk)


def probe_the_bug(probe: torch.Tensor, seed: int = 0) -> tuple[str | None, list[int]]:
    """On a VectorInsideCAT (C = 4, weights from ``seed``): what check_causal says (None if it
    passes), and which later tokens of ``probe`` (1, T) move output 0, changed one at a time."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        buggy = VectorInsideCAT(FIXED_CAT).double().eval()
    try:
        check_causal(buggy, probe, positions=[0, 2, 5])
        message = None
    except CheckFailed as err:
        message = str(err)
    with torch.no_grad():
        base = buggy(probe).logits[0, 0]
        seen_by_0 = []
        for p in range(1, probe.shape[1]):
            changed = probe.clone()
            changed[0, p] = (changed[0, p] + 1) % 256
            if (buggy(changed).logits[0, 0] - base).abs().max().item() > 1e-9:
                seen_by_0.append(p)
    return message, seen_by_0


@exercise_check("nb04-15")
def vector_inside_check(t):
    """first_leak and leak_reaches against what check_causal and one-token changes find on the
    buggy CAT (its weights and tokens drawn anew). Returns (check_causal's message, the
    later tokens that move output 0)."""
    first_leak, leak_reaches = t.value("first_leak"), t.value("leak_reaches")
    probe = torch.randint(0, 256, (1, 16), generator=t.fresh_generator())
    message, seen_by_0 = probe_the_bug(probe, seed=t.fresh_int(0, 1 << 30))
    check_true(message is not None, "the bug leaks: check_causal fails")
    check_prediction(first_leak, int(message.split("output at position ")[1].split()[0]),
                     "first_leak vs the position check_causal names",
                     hint="under the bug, which vector opens the group of token 0, and which "
                          "tokens went into it?")
    check_prediction(leak_reaches, max(seen_by_0, default=None),
                     "leak_reaches vs the last token output 0 can see",
                     hint="the compressor reads its whole chunk at once: where does the chunk "
                          "of the vector that output reads end?")
    return message, seen_by_0
