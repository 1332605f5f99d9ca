"""The checks of exercises/05_cat_one_model_many_chunk_sizes.ipynb (see ``exercise_checks``)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from blockmem_lite.checks import CheckFailed, check_close, check_equal
from blockmem_lite.config import ModelConfig
from blockmem_lite.corpora import encode, load_corpus, pack_windows
from blockmem_lite.exercise_checks import exercise_check
from blockmem_lite.masks import cat_mask
from blockmem_lite.measure import flops, metrics
from blockmem_lite.models import build_model, cat
from blockmem_lite.nn import SelfAttention, reference_attention
from blockmem_lite.ops import cat_attention
from blockmem_lite.own_work import check_prediction
from blockmem_lite.plugged_in import Plugged, judge_plugged_in, plug, swap_modules
from blockmem_lite.runtime import autocast_context

# The two small CATs the capstone plugs the student's layer into.
CAPSTONE_CFGS = {
    "fixed C=4": ModelConfig(arch="cat", d_model=32, n_layer=2, n_head=2, seq_len=64,
                             chunk_size=4),
    "multi-chunk C=4/8/16": ModelConfig(arch="cat", d_model=32, n_layer=2, n_head=2,
                                        seq_len=64, chunk_size=8, chunk_sizes=(4, 8, 16)),
}
SMALL_MULTI = CAPSTONE_CFGS["multi-chunk C=4/8/16"]
STEPS, ROWS = 8, 8                 # the capstone trains 8 steps on 8 windows of 64 bytes


def _seeded(model_cfg: ModelConfig, seed: int = 0) -> torch.nn.Module:
    """``build_model(model_cfg)`` with weights drawn from ``seed``; the global RNG is kept."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model(model_cfg)


# --- exercise 1: the capstone, MyCATAttention in two CATs -------------------------------------


def seeded_cat(model_cfg: ModelConfig) -> torch.nn.Module:
    """The same CAT on every call: the capstone builds one for the kit, one for you."""
    torch.manual_seed(0)
    return build_model(model_cfg)


def byte_windows() -> torch.Tensor:
    """The offline corpus's first 40,000 characters as windows of 65 bytes. (616, 65)"""
    return pack_windows(encode(load_corpus("offline", max_chars=40_000)), 64)


def capstone_batches(start: int = 0) -> list:
    """8 (tokens, targets) batches of 8 windows of 64 bytes, from window ``start`` on."""
    windows = byte_windows()[start:start + STEPS * ROWS]
    return [(w[:, :-1], w[:, 1:]) for w in windows.split(ROWS)]


def _plugged(t, name: str):
    layer_class = t.answer("MyCATAttention")

    def plug_in(model):
        return swap_modules(model, cat.CATAttention, lambda old: layer_class(
            old.qkv.in_features, old.n_head, old.rope.base))

    return plug(lambda: seeded_cat(CAPSTONE_CFGS[name]), plug_in)


def capstone_summary(t, name: str) -> dict:
    """Where the answers live: how many layers MyCATAttention replaced in the CAT ``name``,
    the first weight not shared with the kit's."""
    plugged = _plugged(t, name)
    return {"replaced": plugged.replaced, "apart": plugged.apart}


def capstone_logits(t, name: str, tokens: torch.Tensor) -> torch.Tensor:
    """Where the answers live: the logits of the CAT ``name`` with MyCATAttention in it."""
    return _plugged(t, name).logits(tokens)


def capstone_curve(t, name: str, batches: list) -> list[float]:
    """Where the answers live: the loss curve of training that CAT on ``batches``."""
    return _plugged(t, name).curve(batches)


@exercise_check("nb05-capstone-check", own_work={"MyCATAttention": (
    cat.CATAttention, SelfAttention, cat_attention.per_chunk_attention, cat_mask,
    reference_attention)})
def capstone_check(t):
    """MyCATAttention in a fixed-chunk and a multi-chunk CAT: the same logits as the kit's layer
    on shared weights, causal, the same loss curve over 8 training steps on bytes drawn anew.
    Returns {model: (the kit's curve, yours)}."""
    batches = capstone_batches(start=t.fresh_int(0, len(byte_windows()) - STEPS * ROWS))
    curves = {}
    for name, model_cfg in CAPSTONE_CFGS.items():
        found = t.remote(capstone_summary, name)
        yours = Plugged(found["replaced"], found["apart"],
                        lambda tokens, name=name: t.remote(capstone_logits, name, tokens),
                        lambda data, name=name: t.remote(capstone_curve, name, data))
        curves[name] = judge_plugged_in(yours, lambda model_cfg=model_cfg: seeded_cat(model_cfg),
                                        batches, f"your attention in the {name} CAT")
    return curves


# --- exercise 2: the loss along the dial ------------------------------------------------------


def loss_by_hand(model, batches, c: int, max_batches: int) -> float:
    """The validation loss at chunk size ``c`` from the model's own loss, batch by batch (all
    targets count), over the first ``max_batches`` of ``batches``."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), autocast_context(model.device, "auto"):       # as evaluate does
        for x, y in list(batches)[:max_batches]:
            x, y = x.to(model.device), y.to(model.device)
            total += float(model(x, y, chunk_size=c).loss) * y.numel()
            count += y.numel()
    return total / count


def losses_per_chunk(t, weights: dict, xs: torch.Tensor, ys: torch.Tensor, batch_size: int,
                     chunk_sizes: tuple, max_batches: int):
    """Where the answers live: val_loss_per_chunk on the small multi-chunk CAT holding
    ``weights``, over a DataLoader of (xs, ys) in batches of ``batch_size``."""
    val_loss_per_chunk = t.answer("val_loss_per_chunk")
    model = _seeded(SMALL_MULTI).eval()
    model.load_state_dict(weights)
    data = DataLoader(TensorDataset(xs, ys), batch_size=batch_size)
    return val_loss_per_chunk(model, data, chunk_sizes, max_batches)


def _notebook_object(t, name: str):
    """A teacher cell's object in the notebook, where a remote function runs."""
    if name not in t.namespace:
        raise CheckFailed(f"{name} is not defined: run the notebook's cells above first, then "
                          "this check")
    return t.namespace[name]


def trained_run(t) -> dict:
    """Where the answers live: the notebook's trained CAT (its config, weights and device)
    and the validation batches its measurement read (the first eval_batches)."""
    model = _notebook_object(t, "model")
    val_loader = _notebook_object(t, "val_loader")
    max_batches = _notebook_object(t, "cfg").train.eval_batches
    batches = []
    for x, y in val_loader:
        if len(batches) == max_batches:
            break
        batches.append((x, y))
    return {"config": model.cfg.to_dict(), "device": str(model.device),
            "weights": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "batches": batches}


def _direction(losses: dict, sizes: tuple) -> str:
    change = losses[max(sizes)] - losses[min(sizes)]
    return "flat" if abs(change) < 0.01 else ("up" if change > 0 else "down")


def _check_losses(got, expected: dict, name: str) -> None:
    """``got`` is {chunk size: loss} for the chunk sizes of ``expected``, within ~1e-5."""
    sizes = sorted(expected)
    if not isinstance(got, dict) or set(got) != set(sizes):
        found = sorted(got, key=str) if isinstance(got, dict) else type(got).__name__
        raise CheckFailed(f"{name}: expected a dict {{chunk size: loss}} for the chunk sizes "
                          f"{sizes}\n  got {str(found)[:80]}")
    # float32 means summed in another order (and autocast on a GPU): agree to ~1e-5, not 1e-6
    check_close([float(got[c]) for c in sizes], [expected[c] for c in sizes], name, atol=1e-5,
                rtol=1e-5)


@exercise_check("nb05-13")
def loss_per_chunk_check(t):
    """val_loss_per_chunk on a CAT and bytes drawn anew against the model's own loss at each
    chunk size; then the notebook's measurement and the direction read off it."""
    model = _seeded(SMALL_MULTI, t.fresh_int(0, 1 << 30)).eval()
    batch_size, n_batches = 4, 5
    windows = byte_windows()
    start = t.fresh_int(0, len(windows) - batch_size * n_batches)
    chosen = windows[start:start + batch_size * n_batches]
    xs, ys = chosen[:, :-1], chosen[:, 1:]
    batches = list(zip(xs.split(batch_size), ys.split(batch_size), strict=True))
    max_batches = t.fresh_int(2, n_batches - 1)
    sizes = model.chunk_sizes
    got = t.remote(losses_per_chunk, model.state_dict(), xs, ys, batch_size, sizes, max_batches)
    _check_losses(got, {c: loss_by_hand(model, batches, c, max_batches) for c in sizes},
                  f"val_loss_per_chunk on an untrained CAT, {max_batches} of {n_batches} "
                  "batches (knob + evaluate vs chunk_size=C in forward)")

    run = t.remote(trained_run)
    device = torch.device(run["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        device = torch.device("cpu")
    trained = build_model(ModelConfig.from_dict(run["config"]))
    trained.load_state_dict(run["weights"])
    trained = trained.to(device)
    sizes = trained.chunk_sizes
    reference = {c: loss_by_hand(trained, run["batches"], c, len(run["batches"])) for c in sizes}
    _check_losses(t.value("measured"), reference, "validation loss per chunk size of the "
                  "trained CAT (knob + evaluate vs chunk_size=C in forward)")
    check_prediction(t.value("direction"), _direction(reference, sizes),
                     "the direction you read off the measurement",
                     hint="take the loss at the largest chunk size minus the loss at the "
                          "smallest; a change under 0.01 either way counts as flat")


# --- exercise 3: the bilinear resize of W_f ---------------------------------------------------


@exercise_check("nb05-17", own_work={"resize_columns": (F.interpolate,
                                                        cat.Compressor.projection)})
def resize_check(t):
    """resize_columns against the compressor's own resize at every chunk size (weights drawn
    anew), then against F.interpolate on a float64 matrix, down and up, sizes drawn anew too."""
    resize_columns = t.answer("resize_columns")
    model_cfg = dataclasses.replace(SMALL_MULTI, chunk_sizes=(4, 8, 16, 32), chunk_size=16)
    comp = _seeded(model_cfg, t.fresh_int(0, 1 << 30)).compressor
    for c in comp.chunk_sizes:    # float32 weights: F.interpolate rounds its blend in its own order
        check_close(resize_columns(comp.proj.weight.detach(), c * model_cfg.d_model),
                    comp.projection(c).detach(), f"W_f resized to C={c} vs the compressor's",
                    atol=1e-6, rtol=1e-5)
    gen = t.fresh_generator()
    rows, cols = t.fresh_int(2, 7), t.fresh_int(5, 40)
    for shape, sizes in (((5, 24), (3, 8, 24, 40)),
                         ((rows, cols), (t.fresh_int(1, cols - 1), t.fresh_int(cols + 1, 80)))):
        weight = torch.randn(*shape, dtype=torch.float64, generator=gen)
        for new_cols in sizes:
            expected = F.interpolate(weight[None, None], size=(shape[0], new_cols),
                                     mode="bilinear", align_corners=False)[0, 0]
            check_close(resize_columns(weight, new_cols), expected,
                        f"bilinear resize {shape} -> ({shape[0]}, {new_cols}), down and up")


# --- exercise 4: which chunk size for this job ------------------------------------------------


def chosen_sizes(t, config: dict, cases: list) -> list:
    """Where the answers live: choose_chunk_size(t, budget, model) for each (t, budget) of
    ``cases``, on a CAT of ``config`` (``ModelConfig.to_dict``)."""
    choose_chunk_size = t.answer("choose_chunk_size")
    model = _seeded(ModelConfig.from_dict(config))
    return [choose_chunk_size(length, budget, model) for length, budget in cases]


def _expected_choices(probe, cases: list) -> list:
    """The kit's (smallest chunk size whose cache fits, decode FLOP ceiling) per case."""
    m = probe.cfg
    slot_bytes = 2 * m.n_layer * probe.width * 4                      # one slot, all layers, k and v
    found = []
    for length, budget in cases:
        fits = [c for c in probe.chunk_sizes if probe.cache_slots(length, c) * slot_bytes <= budget]
        c = min(fits) if fits else None
        ceiling = None
        if c is not None:
            ceiling = flops.flop_ceiling(
                metrics.flops_per_token(dataclasses.replace(m, arch="dense"), seq_len=length,
                                        decode=True),
                metrics.flops_per_token(dataclasses.replace(m, chunk_size=c), seq_len=length,
                                        decode=True))
        found.append((c, ceiling))
    return found


def _budget_cases(probe, lengths: list) -> list:
    """(t, budget) pairs: fractions of a dense cache, and the budgets at every edge."""
    m = probe.cfg
    slot_bytes = 2 * m.n_layer * probe.width * 4
    cases = []
    for length in lengths:
        dense_cache = 2 * m.n_layer * length * m.d_model * 4
        exact = [probe.cache_slots(length, c) * slot_bytes for c in probe.chunk_sizes]
        for budget in (dense_cache, dense_cache // 3, dense_cache // 8, dense_cache // 1000,
                       *exact, *(b - 1 for b in exact)):
            cases.append((length, budget))
    return cases


@exercise_check("nb05-23")
def choose_chunk_size_check(t):
    """choose_chunk_size against the kit's cache sizes and FLOP model, at budgets around every
    edge: on the small multi-chunk CAT at t = T and 16 T (the notebook's fast sizes), and on
    a CAT whose sizes and context are drawn anew."""
    low = 2 ** t.fresh_int(1, 3)
    sizes = tuple(low << i for i in range(t.fresh_int(2, 4)))
    drawn = ModelConfig(arch="cat", d_model=16 * t.fresh_int(1, 4), n_layer=t.fresh_int(1, 4),
                        n_head=2, seq_len=max(sizes) * t.fresh_int(1, 4),
                        chunk_size=sizes[t.fresh_int(0, len(sizes) - 1)], chunk_sizes=sizes)
    for model_cfg, lengths in ((SMALL_MULTI, (64, 16 * 64)),
                               (drawn, (t.fresh_int(drawn.seq_len, 64 * drawn.seq_len),))):
        probe = _seeded(model_cfg)
        cases = _budget_cases(probe, lengths)
        got = t.remote(chosen_sizes, model_cfg.to_dict(), cases)
        if not (isinstance(got, list) and len(got) == len(cases) and
                all(isinstance(a, (tuple, list)) and len(a) == 2 for a in got)):
            raise CheckFailed("choose_chunk_size: expected a pair (chunk size, FLOP ceiling) "
                              f"for each t and budget, got {str(got)[:80]}")
        where = f"d={model_cfg.d_model}, sizes {model_cfg.chunk_sizes}"
        for (length, budget), answer, (c, ceiling) in zip(cases, got,
                                                          _expected_choices(probe, cases),
                                                          strict=True):
            check_equal(answer[0], c, f"{where}, t={length}, budget {budget:,} B: smallest "
                        "chunk size that fits")
            if c is not None:
                check_close(answer[1], ceiling, f"{where}, t={length}, C={c}: decode FLOP "
                            "ceiling vs dense")
