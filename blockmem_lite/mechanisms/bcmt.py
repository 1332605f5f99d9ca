"""BCMT's and HOnly's registrations: FLOP model, state size, lab record (block_size is a knob).

``models/bcmt.py`` holds what the paper defines (options, memory maths, layer, LMs,
reference forward); this module holds what the kit needs to run, measure and compare
them, and ends by registering both names, ``bcmt`` and its ablation ``honly``.
"""

from __future__ import annotations

import dataclasses

from blockmem_lite.labdata import bench_value, loss_gap, memory_ratio
from blockmem_lite.measure.flops import layer_matmul_flops, lm_head_flops
from blockmem_lite.models.bcmt import BCMTLM, BCMTOptions, HOnlyLM, HOnlyOptions
from blockmem_lite.registry import Claim, LabSpec, Mechanism, register, register_lab
from blockmem_lite.validation import check_positive

# --- FLOP model --------------------------------------------------------------------------

def block_local_layer_flops(d_model: int, block_size: int) -> float:
    """Block-local causal layer (BCMT, HOnly): ``24·d² + 2·L·d`` per token.

    The summary/decay term is negligible and left out (docs/MEASUREMENTS.md, The FLOP model).
    Per token this is also the average cost of decoding inside a block.
    """
    check_positive("block_size", block_size)
    return layer_matmul_flops(d_model) + 2.0 * block_size * d_model


def bcmt_layer_flops(d_model: int, block_size: int, seq_len: int) -> float:
    """BCMT layer: block-local attention plus the memory path, per token.

    ``24·d² + 2·L·d`` (block-local) ``+ 2·d²`` (gate on U; the gate's P half, the
    memory projection W_p and the summary pooling cost ``4·d²/L + 4·d`` per token)
    ``+ 2·N·d/L`` (the N x N decay mix over N = T/L summaries). The gate is not
    negligible: it is the kit's design choice (docs/PAPERS.md, BCMT paper vs kit) and
    costs about 8% of the layer, which lowers BCMT's ceiling below block-local's.
    """
    local = block_local_layer_flops(d_model, block_size)
    check_positive("seq_len", seq_len)
    n_blocks = -(-seq_len // block_size)
    memory_path = (2.0 * d_model ** 2 + 4.0 * d_model ** 2 / block_size + 4.0 * d_model
                   + 2.0 * n_blocks * d_model / block_size)
    return local + memory_path


def flops_per_token(cfg, seq_len: int, decode: bool = False) -> float:
    """Forward FLOPs per token of a BCMT / HOnly config (decoding costs the same per token:
    a block of cache at most). A block longer than the sequence is the whole sequence."""
    block = min(cfg.block_size, seq_len)
    with_memory = getattr(cfg, "memory", False)
    layer = (bcmt_layer_flops(cfg.d_model, block, seq_len) if with_memory
             else block_local_layer_flops(cfg.d_model, block))
    return cfg.n_layer * layer + lm_head_flops(cfg.d_model, cfg.vocab_size)


# --- decoding state (the bench flag --block-size and the presets are the knob's) ------

def state_bytes(cfg, t: int) -> float:
    """Per layer: at most one block of KV (``2·L·d``) plus the memory state (the open block's
    U, ``L·d``, and num, den, P, the gate's P half, about ``3·d``) (fp32); BCMT's does not
    grow with t."""
    memory = (cfg.block_size + 3) * cfg.d_model if getattr(cfg, "memory", False) else 0
    return 4.0 * cfg.n_layer * (2 * cfg.block_size * cfg.d_model + memory)


# --- the lab's record: claims and recipe (registry.register_lab) ---

def memory_slots(cfg, n_pairs: int) -> int:
    """The slot model of the block memory: one slot. The memory is a decayed mean of block
    summaries, added to every token through a gate, never addressed by the query's key; so
    all the pairs share it (0 slots without the memory)."""
    return 1 if cfg.memory else 0


PAPER = "BCMT: Blockwise Causal Memory Transformer (Arezki, 2026)"
CLAIMS = (
    Claim("bcmt.loss_vs_dense", PAPER, "2608.13578", "paper summary; third-party review "
          "(Table 2)", "validation loss, BCMT-256 minus dense", 4.5931 - 4.5752, "nats",
          "context 1024, WikiText-103 (dense 4.5752, BCMT-256 4.5931; model size not stated)",
          "within 0.05 nats of dense", kit=lambda r: loss_gap(r, "bcmt", "dense"),
          holds=lambda gap: gap <= 0.05),
    Claim("bcmt.train_speed", PAPER, "2608.13578", "paper summary (not verified)",
          "training throughput, BCMT-128 over dense", 204.2 / 119.9, "x dense",
          "204.2K vs 119.9K tokens/s on a GPU, context 1024", "faster than dense in training",
          kit=lambda r: bench_value(r, "bcmt", "train", "ratio_vs_dense"),
          holds=lambda ratio: ratio > 1.0,
          ceiling=lambda r: bench_value(r, "bcmt", "train", "flop_ceiling")),
    Claim("bcmt.train_memory", PAPER, "2608.13578", "paper summary (not verified)",
          "training memory, dense over BCMT-128", 14.37 / 10.48, "x less",
          "peak GPU memory 14.37 vs 10.48 GB, context 1024", "less memory than dense in training",
          kit=lambda r: memory_ratio(r, "bcmt", "train"), holds=lambda ratio: ratio > 1.0,
          note="kit memory: bytes saved for backward, same run"),
    Claim("bcmt.honly_worse", PAPER, "2608.13578", "paper summary and review",
          "validation loss, HOnly minus BCMT", None, "nats", "HOnly = BCMT without the memory",
          "the memory helps (HOnly's loss is higher)", kit=lambda r: loss_gap(r, "honly", "bcmt"),
          holds=lambda gap: gap > 0.0),
)

register(Mechanism(
    name="bcmt", model=BCMTLM, options=BCMTOptions, flops=flops_per_token,
    state_bytes=state_bytes,
    summary="blockwise causal memory: block-local attention + a decayed memory of block "
            "summaries, shifted one block and gated into every token"))
register_lab("bcmt", LabSpec(claims=CLAIMS, memory_slots=memory_slots,
                             twin=lambda cfg: dataclasses.replace(cfg, memory=False)))
register(Mechanism(
    name="honly", model=HOnlyLM, options=HOnlyOptions, flops=flops_per_token,
    state_bytes=state_bytes,
    summary="the HOnly ablation of BCMT: block-local attention, no memory between blocks"))
register_lab("honly", LabSpec(memory_slots=lambda cfg, n_pairs: 0))
