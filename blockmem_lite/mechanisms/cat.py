"""CAT's registration: its FLOP model and ``state_bytes``, and the lab's record (claims and
recipe), ending in ``register``. The model is ``models.cat``; the bench flags
``--chunk-size`` and ``--decoder-width`` and their ``C=16 w=2`` variants are its knobs'.
"""

from __future__ import annotations

import dataclasses
import math

from blockmem_lite.labdata import bench_value, best, loss_gap, memory_ratio
from blockmem_lite.measure.flops import layer_matmul_flops, lm_head_flops
from blockmem_lite.models.cat import CATLM, CATOptions
from blockmem_lite.registry import (
    BenchSpec,
    Claim,
    LabSpec,
    Mechanism,
    register,
    register_bench,
    register_lab,
)
from blockmem_lite.validation import check_non_negative, check_positive

# --------------------------------------------------------------------------------------
# FLOP model, state
# --------------------------------------------------------------------------------------

def cat_decoder_layer_flops(d_decoder: int, chunk_size: int, seq_len: int) -> float:
    """CAT decoder layer of width D: ``(1 + 1/C)·[24·D² + 2·D·(C + T/C)]`` per token.

    (1 + 1/C): one compressed slot per chunk of C tokens; each query sees its
    own chunk (C) and the T/C chunk vectors.
    """
    check_positive("chunk_size", chunk_size)
    check_positive("seq_len", seq_len)
    return (1.0 + 1.0 / chunk_size) * (
        layer_matmul_flops(d_decoder) + 2.0 * d_decoder * (chunk_size + seq_len / chunk_size))


def cat_decode_layer_flops(d_decoder: int, chunk_size: int, context_len: int) -> float:
    """CAT decoder layer, one decoding step at context ``t``:
    ``(1 + 1/C)·[24·D² + 4·D·(t/C + C/2)]``.

    Derived like ``flops.dense_decode_layer_flops``: the new query sees every
    cached chunk vector (t/C) and on average half of its own chunk, 4·D per
    key; the compressed slot written once per chunk adds the 1/C.
    """
    check_positive("chunk_size", chunk_size)
    check_positive("context_len", context_len)
    return (1.0 + 1.0 / chunk_size) * (
        layer_matmul_flops(d_decoder)
        + 4.0 * d_decoder * (context_len / chunk_size + chunk_size / 2.0))


def cat_compressor_flops(d_compressor: int, chunk_size: int, depth_ratio: float) -> float:
    """CAT compressor, per token per decoder layer: ``ρ·[24·d² + 4·d·(C+1)]``.

    ρ = compressor depth / decoder depth; attention is bidirectional over the
    C + 1 slots of a chunk (no causal half, hence 4·d per key).
    """
    check_positive("chunk_size", chunk_size)
    check_non_negative("depth_ratio", depth_ratio)
    return depth_ratio * (layer_matmul_flops(d_compressor) + 4.0 * d_compressor * (chunk_size + 1))


def cat_projection_flops(d_compressor: int, d_decoder: int) -> float:
    """CAT projection W_f (D × C·d_f, once per chunk of C tokens): ``2·D·d_f`` per token.

    Paid once per model, not per layer.
    """
    check_positive("d_compressor", d_compressor)
    check_positive("d_decoder", d_decoder)
    return 2.0 * d_decoder * d_compressor


def cat_layer_flops(d_model: int, chunk_size: int, seq_len: int, *,
                    d_decoder: int | None = None, depth_ratio: float = 0.25) -> float:
    """CAT per decoder layer: decoder + compressor (projection excluded, see above).

    ``d_decoder`` defaults to ``d_model`` (same-width CAT); ``depth_ratio`` ρ
    defaults to 1/4 (compressor depth = decoder depth / 4).
    """
    width = d_model if d_decoder is None else d_decoder
    return (cat_decoder_layer_flops(width, chunk_size, seq_len)
            + cat_compressor_flops(d_model, chunk_size, depth_ratio))


def flops_per_token(cfg, seq_len: int, decode: bool = False) -> float:
    """Forward FLOPs per token at ``cfg.chunk_size``: n_layer decoder layers of width
    D = decoder_width·d, the compressor blocks, W_f once, and the head at width D."""
    width = cfg.d_model * cfg.decoder_width
    depth = cfg.compressor_layers or max(1, cfg.n_layer // 4)
    decoder = (cat_decode_layer_flops(width, cfg.chunk_size, seq_len) if decode
               else cat_decoder_layer_flops(width, cfg.chunk_size, seq_len))
    return (cfg.n_layer * decoder + depth * cat_compressor_flops(cfg.d_model, cfg.chunk_size, 1.0)
            + cat_projection_flops(cfg.d_model, width) + lm_head_flops(width, cfg.vocab_size))


def state_bytes(cfg, t: int) -> float:
    """Per decoder layer, at width D: the chunk vectors so far and the current chunk,
    ``2·(t/C + C)·D`` numbers (fp32)."""
    width = cfg.d_model * cfg.decoder_width
    return 4.0 * cfg.n_layer * 2 * (math.ceil(t / cfg.chunk_size) + cfg.chunk_size) * width


# --- the lab's record: claims and recipe (registry.register_lab) ---

LAB_CHUNK_SIZES = (4, 8, 16, 32)          # the paper's multi-chunk sizes


def lab_config(cfg):
    """The comparison lab trains one multi-chunk model (the paper's sizes that fit T)."""
    sizes = tuple(c for c in LAB_CHUNK_SIZES if c <= cfg.seq_len) or (cfg.seq_len,)
    default = 16 if 16 in sizes else sizes[-1]
    return dataclasses.replace(cfg, chunk_sizes=sizes, chunk_size=default)


def _chunk_variants(cfg) -> list[tuple[str, dict]]:
    return [(f"C={c}", {"chunk_size": c}) for c in (cfg.chunk_sizes or (cfg.chunk_size,))]


def _recall_span(cfg, span: int):
    """The recall experiment's config: the multi-chunk model over the lab's sizes up to
    ``span`` (the paper's multi-chunk training), serving ``span`` by default."""
    sizes = tuple(c for c in LAB_CHUNK_SIZES if c <= span) or (span,)
    return dataclasses.replace(cfg, chunk_sizes=sizes if cfg.chunk_sizes else (),
                               chunk_size=sizes[-1] if cfg.chunk_sizes else span)


def memory_slots(cfg, n_pairs: int) -> int:
    """The slot model of CAT's memory: one slot per chunk vector, addressed by the decoder's
    attention; ``n_pairs`` pairs (2 tokens each) at the row's start fill
    ceil(2 n_pairs / C) chunks (0 slots for the twin, whose chunk vectors are zero). A
    floor, not a ceiling: a chunk vector can bind its keys to their values (trained at C=4
    alone, CAT answers every one of 4 pairs; docs/MEASUREMENTS.md, the memory-size sweeps)."""
    return -(-2 * n_pairs // cfg.chunk_size) if cfg.memory else 0


def _set_chunk_size(model, overrides: dict) -> None:
    model.chunk_size = overrides["chunk_size"]


def _bench_at_its_chunk_size(model, cfg) -> None:
    """A multi-chunk model trains at a chunk size drawn per call; the bench pins it to the
    record's C, so a ``C=32`` training record times and measures C = 32 (unpinned, every
    C of one model would time the same random mix, and its saved-tensor figure would be
    that of whichever C the measuring call drew)."""
    if cfg.chunk_sizes:
        model.pin_training_chunk_size(cfg.chunk_size)


def _over_chunk_sizes(fn, pick=max) -> float | None:
    """``pick`` of ``fn(variant label)`` over the lab's chunk sizes (None where unmeasured)."""
    return best((fn(f"C={c}") for c in LAB_CHUNK_SIZES), pick)


def _fastest_chunk_size(results: dict) -> str | None:
    """The variant label ("C=16") decoding fastest vs dense at the longest length."""
    ratios = {f"C={c}": bench_value(results, "cat", "decode", "ratio_vs_dense", variant=f"C={c}")
              for c in LAB_CHUNK_SIZES}
    measured = {label: ratio for label, ratio in ratios.items() if ratio is not None}
    return max(measured, key=measured.get) if measured else None


def _at_fastest_chunk_size(results: dict, key: str):
    """A decode record's ``key`` at the fastest chunk size (its ratio and its own ceiling)."""
    variant = _fastest_chunk_size(results)
    return None if variant is None else bench_value(results, "cat", "decode", key,
                                                     variant=variant)


PAPER = "CAT: Compress & Attend Transformer (Prakash, Puli, Ranganath)"
CLAIMS = (
    Claim("cat.decode_speed", PAPER, "2511.05313", "abstract v1",
          "generation speed over dense (lower end)", 1.4, "x dense",
          "one multi-chunk model, several scales, GPU", "faster than dense in generation",
          kit=lambda r: _at_fastest_chunk_size(r, "ratio_vs_dense"),
          holds=lambda ratio: ratio > 1.0,
          ceiling=lambda r: _at_fastest_chunk_size(r, "flop_ceiling"),
          note="best chunk size at the longest length, batch 1"),
    Claim("cat.memory", PAPER, "2511.05313", "abstract v1",
          "total memory, dense over CAT (lower end)", 2.0, "x less",
          "one multi-chunk model, several scales, GPU", "at least 2x less decoding memory",
          kit=lambda r: _over_chunk_sizes(lambda v: memory_ratio(r, "cat", "decode",
                                                                  "state_bytes", variant=v)),
          holds=lambda ratio: ratio >= 2.0,
          note="kit memory: the decoding state at the longest length, best chunk size"),
    Claim("cat.loss", PAPER, "2511.05313", "abstract v1",
          "language-modelling loss, CAT minus dense", 0.0, "nats",
          "matches dense across model scales (2x decoder width)",
          "within 0.05 nats of dense at some chunk size",
          kit=lambda r: _over_chunk_sizes(lambda v: loss_gap(r, "cat", "dense", v), min),
          holds=lambda gap: gap <= 0.05, note="the best chunk size"),
)


register(Mechanism(
    name="cat", model=CATLM, options=CATOptions, flops=flops_per_token,
    state_bytes=state_bytes,
    summary="compress & attend: chunks compressed to one vector each; a decoder reads its own "
            "chunk plus every earlier chunk vector"))
register_bench("cat", BenchSpec(prepare=_bench_at_its_chunk_size))
register_lab("cat", LabSpec(config=lab_config, variants=_chunk_variants, switch=_set_chunk_size,
                            recall_span=_recall_span, memory_slots=memory_slots, claims=CLAIMS,
                            twin=lambda cfg: dataclasses.replace(cfg, memory=False)))
