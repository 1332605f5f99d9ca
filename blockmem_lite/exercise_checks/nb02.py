"""The checks of exercises/02_bcmt_blocks_and_decay_memory.ipynb (see ``exercise_checks``)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from blockmem_lite.checks import check_causal, check_close, check_equal, check_shape, check_true
from blockmem_lite.config import ModelConfig
from blockmem_lite.exercise_checks import exercise_check
from blockmem_lite.models import bcmt, build_model
from blockmem_lite.models.bcmt import (
    block_summaries,
    decay_weights,
    memory_matrix_form,
    memory_scan_form,
    shift_one_block,
)
from blockmem_lite.own_work import check_prediction

L, D = 16, 8                      # the block size and width of exercise 2's fixed cases
SHIFT_MODEL = ModelConfig(arch="bcmt", d_model=32, n_layer=2, n_head=2, seq_len=64,
                          block_size=16)          # the BCMT exercise 3's check plants a shift in


@exercise_check("nb02-05", own_work={"multi_rate_decay_weights": (decay_weights,
                                                                  memory_matrix_form)})
def multi_rate_check(t):
    """multi_rate_decay_weights against decay_weights one rate at a time (fixed rates and
    rates drawn anew), and 2000 blocks without overflow."""
    multi_rate_decay_weights = t.answer("multi_rate_decay_weights")
    gen = t.fresh_generator()
    drawn = [round(a, 3) for a in torch.rand(t.fresh_int(2, 5), generator=gen).tolist()]
    cases = [(n_blocks, [0.8, 0.3, 0.0, 1.0, 0.95]) for n_blocks in (1, 6, 9)]
    cases.append((t.fresh_int(2, 30), drawn))
    for n_blocks, alphas in cases:
        weights = multi_rate_decay_weights(n_blocks, alphas)
        check_shape(weights, (len(alphas), n_blocks, n_blocks), f"weights for {n_blocks} blocks")
        check_equal(weights.dtype, torch.float64, f"dtype of the weights for {n_blocks} blocks")
        check_close(weights, torch.stack([decay_weights(n_blocks, a, torch.float64)
                                          for a in alphas]),
                    f"{n_blocks} blocks, alphas {alphas} vs decay_weights one rate at a time")
    big = multi_rate_decay_weights(2000, [0.8, 0.5])
    check_true(bool(big.isfinite().all()), "2000 blocks: every weight is finite")
    check_close(big.sum(-1), torch.ones(2, 2000, dtype=torch.float64),
                "2000 blocks: every row of both matrices sums to 1")


def kit_summaries(states, scores, block_size, lengths):
    """block_summaries row by row (it takes one n_valid); an all-padding block's NaN -> 0."""
    missing = -states.shape[1] % block_size
    rows = [block_summaries(F.pad(s[None], (0, 0, 0, missing)), F.pad(a[None], (0, missing)),
                            block_size, n_valid=int(n))
            for s, a, n in zip(states, scores, lengths, strict=True)]
    return [torch.cat(parts).nan_to_num(0.0) for parts in zip(*rows, strict=True)]


@exercise_check("nb02-08", own_work={"padded_block_summaries": (block_summaries,
                                                                kit_summaries)})
def padded_summaries_check(t):
    """padded_block_summaries against block_summaries row by row, on random states and scores
    (drawn anew) of three lengths and of a block size drawn anew; blocks with no real token."""
    padded_block_summaries = t.answer("padded_block_summaries")
    gen = t.fresh_generator()
    size = t.fresh_int(3, 12)
    length = t.fresh_int(size + 1, 4 * size)
    drawn = torch.tensor([length, t.fresh_int(1, length), t.fresh_int(1, size)])
    cases = [(L, n, torch.tensor([n, n - 3, 2])) for n in (3 * L, 3 * L - 5, L + 1)]
    cases.append((size, length, drawn))           # row 2: at most one block holds a real token
    for block_size, steps, lengths in cases:      # full, a short tail, one short block
        states = torch.randn(3, steps, D, dtype=torch.float64, generator=gen)
        scores = 3 * torch.randn(3, steps, dtype=torch.float64, generator=gen)
        summaries, pi = padded_block_summaries(states, scores, block_size, lengths)
        lib_summaries, lib_pi = kit_summaries(states, scores, block_size, lengths)
        label = f"T={steps}, L={block_size}, lengths {lengths.tolist()}"
        check_close(summaries, lib_summaries, f"{label}: summaries")
        check_close(pi, lib_pi, f"{label}: weights")
        check_true(bool((pi[2, 1:] == 0).all() and (summaries[2, 1:] == 0).all()),
                   f"{label}: blocks without a real token: weights 0 and summary 0")


def make_bcmt(model_cfg: ModelConfig = SHIFT_MODEL) -> nn.Module:
    """A BCMT LM, seeded, in eval mode. A fresh BCMT's W_p is zero (it starts as HOnly):
    random W_p give the memory a voice, or no leak of a wrong shift shows."""
    torch.manual_seed(0)
    model = build_model(model_cfg).eval()
    with torch.no_grad():
        for layer in model.blocks:
            nn.init.normal_(layer.memory_proj.weight, std=0.3)
    return model


def shifted_logits(t, weights: dict, tokens: torch.Tensor) -> torch.Tensor:
    """In the student's notebook: the logits of SHIFT_MODEL holding ``weights`` with every
    layer's shift replaced by fixed_shift (lag 1), as exercise 3 plants it."""
    fixed_shift = t.answer("fixed_shift")

    class FixedShiftBCMT(bcmt.BCMTLM):
        shift = staticmethod(fixed_shift)         # step 4 of every layer: the student's shift

    model = FixedShiftBCMT(SHIFT_MODEL).eval()
    model.load_state_dict(weights)
    with torch.no_grad():
        return model(tokens).logits


@exercise_check("nb02-12", own_work={"fixed_shift": (shift_one_block,)})
def fixed_shift_check(t):
    """fixed_shift against shift_one_block applied k times (memories and a size drawn anew),
    then planted in a BCMT: the kit's logits, and check_causal agrees."""
    fixed_shift = t.answer("fixed_shift")
    gen = t.fresh_generator()
    memories = torch.randn(2, 5, 3, generator=gen)
    check_equal(fixed_shift(memories), shift_one_block(memories),
                "fixed_shift(M) vs shift_one_block")
    check_equal(fixed_shift(memories, 2), shift_one_block(shift_one_block(memories)),
                "fixed_shift(M, 2): block i reads M_{i-2}")
    check_equal(fixed_shift(memories, 0), memories, "fixed_shift(M, 0): no shift")
    check_equal(fixed_shift(memories, 7), torch.zeros_like(memories),
                "fixed_shift(M, 7), more than N = 5 blocks: every block reads zeros")
    n_blocks = t.fresh_int(2, 9)
    lag = t.fresh_int(1, n_blocks + 2)
    memories = torch.randn(t.fresh_int(1, 3), n_blocks, t.fresh_int(2, 6), generator=gen)
    expected = memories
    for _ in range(lag):
        expected = shift_one_block(expected)
    check_equal(fixed_shift(memories, lag), expected,
                f"fixed_shift(M, {lag}) for N = {n_blocks} blocks: block i reads M_(i-{lag})")
    kit = make_bcmt()
    tokens = torch.randint(0, SHIFT_MODEL.vocab_size, (2, 4 * SHIFT_MODEL.block_size),
                           generator=gen)
    weights = kit.state_dict()

    def planted(tokens):
        return t.remote(shifted_logits, weights, tokens)

    with torch.no_grad():
        check_close(planted(tokens), kit(tokens).logits,
                    "a BCMT with your fixed_shift vs the kit's BCMT, the same weights")
    check_causal(planted, tokens, vocab_size=SHIFT_MODEL.vocab_size,
                 block_sizes=SHIFT_MODEL.block_size)


def effective_horizon(alpha, n_blocks, mass=0.9):
    """How many of the newest blocks hold `mass` of the last block's memory weight."""
    newest_first = decay_weights(n_blocks, alpha, torch.float64)[-1].flip(0)
    return int((newest_first.cumsum(0) < mass - 1e-9).sum()) + 1


MEMORY_HINT = ("which weights alpha^(i-j) survive in this limit, and what does dividing by "
               "their sum leave? (B, N, D) in, (B, N, D) out")
HORIZON_HINT = ("how many of the newest weights make up at least 90% of the total? Is 90% of "
                "37 blocks a whole number?")


@exercise_check("nb02-16", own_work={
    "predicted_memory": (memory_matrix_form, memory_scan_form, decay_weights),
    "predicted_horizon": (effective_horizon, decay_weights)})
def limits_check(t):
    """predicted_memory and predicted_horizon against the memory at alpha in {0, 0.001} and
    {1, 0.999}; summaries, a sequence length and a horizon drawn anew besides fixed ones."""
    predicted_memory = t.answer("predicted_memory")
    predicted_horizon = t.answer("predicted_horizon")
    gen = t.fresh_generator()
    fixed = torch.randn(2, 20, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    drawn = torch.randn(t.fresh_int(1, 3), t.fresh_int(2, 20), t.fresh_int(2, 6),
                        dtype=torch.float64, generator=gen)
    lengths = (20, 37, 50, t.fresh_int(2, 48))    # 37: 90% is not a whole number of blocks
    for limit, alphas in [("zero", (0.0, 0.001)), ("one", (1.0, 0.999))]:
        for a in alphas:
            for summaries in (fixed, drawn):
                check_prediction(predicted_memory(summaries, limit),
                                 memory_matrix_form(summaries, a),
                                 f"predicted_memory(..., {limit!r}) vs the memory at alpha={a}, "
                                 f"summaries {tuple(summaries.shape)}", hint=MEMORY_HINT,
                                 atol=0.02 if a not in (0.0, 1.0) else 1e-9)
            for n_blocks in lengths:
                check_prediction(predicted_horizon(limit, n_blocks),
                                 effective_horizon(a, n_blocks),
                                 f"predicted_horizon({limit!r}, {n_blocks}) vs alpha={a}",
                                 hint=HORIZON_HINT)
