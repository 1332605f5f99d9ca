"""The checks of exercises/07_armt_long_context.ipynb (see ``exercise_checks``)."""

from __future__ import annotations

import dataclasses

import torch

from blockmem_lite import tasks
from blockmem_lite.checks import check_close, check_equal, check_true
from blockmem_lite.config import ModelConfig
from blockmem_lite.exercise_checks import exercise_check
from blockmem_lite.measure import metrics
from blockmem_lite.mechanisms import armt
from blockmem_lite.models import build_model
from blockmem_lite.models.base import IGNORE_INDEX
from blockmem_lite.runtime import seed_everything

# the notebook's model in fast mode (its class preset differs only in d_model=64, d_mem=16)
MODEL = ModelConfig(arch="armt", d_model=32, n_layer=2, n_head=2, seq_len=128, segment_size=16,
                    n_mem_tokens=4, d_mem=8)
# the follow-up paper's scale, for the FLOP budget of exercise 3
BIG = ModelConfig(arch="armt", d_model=256, n_layer=8, n_head=4, seq_len=4096, segment_size=128,
                  n_mem_tokens=16, d_mem=64)


def positions_seen(model, tokens, write_last=False):
    """The position ids the first backbone block receives, call by call (one per segment)."""
    seen = []
    blocks = model.backbone.blocks if hasattr(model, "backbone") else model.blocks
    hook = blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[1].clone()))
    try:
        with torch.no_grad():
            if write_last:
                model.run_segments(tokens, write_last=True)
            else:
                model(tokens)
    finally:
        hook.remove()
    return seen


def measured_unseen(model, total_len: int, trained_len: int) -> int:
    """Distinct position ids ``model(tokens)`` meets on ``total_len`` tokens, not on
    ``trained_len``."""
    def ids(length):
        return set(torch.cat(positions_seen(model, torch.randint(0, 256, (1, length)))).tolist())

    return len(ids(total_len) - ids(trained_len))


@exercise_check("nb07-05", own_work={"backbone_positions": (positions_seen, measured_unseen),
                                     "unseen_positions": (positions_seen, measured_unseen)})
def positions_check(t):
    """backbone_positions and unseen_positions against the position ids a real model's first
    block receives: the notebook's segments and a segment size and memory drawn anew. Returns
    the largest position id ARMT and dense meet, (tokens, ARMT, dense), for a table."""
    backbone_positions = t.answer("backbone_positions")
    S, M = MODEL.segment_size, MODEL.n_mem_tokens
    model = build_model(MODEL).eval()
    dense = build_model(dataclasses.replace(MODEL, arch="dense")).eval()
    fresh_S, fresh_M = t.fresh_int(3, 24), t.fresh_int(1, 6)
    drawn = build_model(dataclasses.replace(MODEL, segment_size=fresh_S,
                                            n_mem_tokens=fresh_M)).eval()
    where = f"S={fresh_S}, M={fresh_M}, "
    cases = [(model, S, M, "", total_len) for total_len in (S - 3, 3 * S, 3 * S + 5, 40 * S)]
    cases += [(drawn, fresh_S, fresh_M, where, total_len)
              for total_len in (t.fresh_int(1, fresh_S), t.fresh_int(fresh_S + 1, 12 * fresh_S))]
    for lm, seg, mem, label, total_len in cases:
        tokens = torch.randint(0, 256, (1, total_len))
        for write_last in (False, True):
            check_equal([p.tolist() for p in backbone_positions(total_len, seg, mem, write_last)],
                        [p.tolist() for p in positions_seen(lm, tokens, write_last)],
                        f"{label}T={total_len}, write_last={write_last}: position ids of every "
                        "backbone call")

    unseen_positions = t.answer("unseen_positions")
    lengths = [(model, S, M, "", pair) for pair in
               ((8 * S, 8 * S), (64 * S, 8 * S), (3 * S, S), (S // 2, S), (5 * S, S + 3))]
    lengths += [(drawn, fresh_S, fresh_M, where, (t.fresh_int(1, 20 * fresh_S),
                                                  t.fresh_int(1, 6 * fresh_S)))]
    for lm, seg, mem, label, (total_len, trained_len) in lengths:
        check_equal(unseen_positions(total_len, trained_len, seg, mem),
                    measured_unseen(lm, total_len, trained_len),
                    f"ARMT, {label}trained on {trained_len} tokens, run on {total_len}: unseen "
                    "position ids")
    for total_len, trained_len in ((64 * S, 8 * S), (4 * S, 8 * S),
                                   (t.fresh_int(1, 40 * S), t.fresh_int(1, 20 * S))):
        check_equal(unseen_positions(total_len, trained_len),
                    measured_unseen(dense, total_len, trained_len),
                    f"dense, trained on {trained_len} tokens, run on {total_len}: unseen "
                    "position ids")
    return [(n * S, max(int(p.max()) for p in positions_seen(
        model, torch.randint(0, 256, (1, n * S)))), n * S - 1) for n in (2, 8, 64)]


@exercise_check("nb07-10", own_work={"key_visible": (tasks.passkey,),
                                     "best_possible_accuracy": (tasks.passkey,
                                                                tasks.task_accuracy)})
def window_check(t):
    """key_visible against where the passkey's key token really is (fixed windows and one
    drawn anew, at its edges); best_possible_accuracy's three cases, and its bound on a
    dense model reading a window of 128 tokens."""
    key_visible = t.answer("key_visible")
    V = 32
    n_choices = tasks.content_vocab(V)
    window = t.fresh_int(8, 100)
    length = t.fresh_int(window + 8, 300)
    cases = [(64, 10, 32), (64, 40, 32), (64, 31, 32), (64, 32, 32), (64, 33, 32),
             (128, 120, 128), (256, 250, 128), (256, 250, None)]
    cases += [(length, distance, window) for distance in
              (window, window + 1, t.fresh_int(2, length - 1))]
    for T, distance, w in cases:
        batch = tasks.passkey(4, T, distance, key_len=1, vocab_size=V, seed=distance)
        key = batch.inputs[:, T - distance]                   # the key token, position T - d
        seen = batch.inputs if w is None else batch.inputs[:, -w:]
        in_input = T - distance >= T - (w or T)
        check_equal(key_visible(distance, w), in_input,
                    f"T={T}, distance={distance}, window={w}: key inside the window")
        if in_input:
            check_true(bool((seen == key[:, None]).any(dim=1).all()),
                       f"T={T}, distance={distance}, window={w}: the key is in what it reads")
    best_possible_accuracy = t.answer("best_possible_accuracy")
    check_close(best_possible_accuracy(40, 128, n_choices), 1.0, "key inside the window")
    check_close(best_possible_accuracy(400, 128, n_choices), 1 / n_choices,
                "key outside the window: chance")
    check_close(best_possible_accuracy(400, None, n_choices), 1.0, "reading everything")
    choices = t.fresh_int(2, 200)
    check_close(best_possible_accuracy(window + 1, window, choices), 1 / choices,
                f"key {window + 1} tokens back, window {window}, {choices} values: chance")
    check_close(best_possible_accuracy(window, window, choices), 1.0,
                f"key {window} tokens back, window {window}, {choices} values: seen")

    dense = build_model(dataclasses.replace(MODEL, arch="dense", vocab_size=V)).eval()
    T, w = 512, MODEL.seq_len
    probe = tasks.passkey(512, T, T - 3, key_len=1, vocab_size=V, seed=1)
    windowed = tasks.TaskBatch(probe.inputs[:, -w:], probe.targets[:, -w:], probe.mask[:, -w:])
    accuracy = tasks.task_accuracy(dense, windowed)
    check_true(accuracy <= best_possible_accuracy(T - 3, w, n_choices) + 0.07,
               f"a dense model with a {w}-token window, key {T - 3} tokens back: "
               f"{accuracy:.3f} (no better than chance, whatever its weights)")


def flops_answers(t, config: dict) -> list:
    """Where the answers live: armt_flops of ``ModelConfig(**config)`` with memory in 0 ..
    n_layer layers."""
    armt_flops = t.answer("armt_flops")
    model_cfg = ModelConfig(**config)
    return [armt_flops(model_cfg, k) for k in range(model_cfg.n_layer + 1)]


def chosen_layers(t, config: dict, budgets: list) -> list:
    """Where the answers live: choose_memory_layers of ``ModelConfig(**config)`` for each of
    ``budgets``."""
    choose_memory_layers = t.answer("choose_memory_layers")
    model_cfg = ModelConfig(**config)
    return [choose_memory_layers(model_cfg, budget) for budget in budgets]


def uppermost_within(model_cfg: ModelConfig, budget: float) -> tuple:
    """The most uppermost layers whose memory keeps the kit's FLOPs within ``budget`` x all."""
    n, full = model_cfg.n_layer, metrics.flops_per_token(model_cfg)
    fits = [k for k in range(n + 1) if k == 0 or metrics.flops_per_token(
        dataclasses.replace(model_cfg, memory_layers=tuple(range(n - k, n)))) <= budget * full]
    return tuple(range(n - max(fits), n))


@exercise_check("nb07-14", own_work={
    "armt_flops": (armt.flops_per_token, metrics.flops_per_token),
    "choose_memory_layers": (armt.flops_per_token, metrics.flops_per_token, uppermost_within)})
def flops_check(t):
    """armt_flops against the kit's metrics.flops_per_token (the notebook's model, the
    follow-up's, one drawn anew), choose_memory_layers on four budgets and one drawn anew."""
    heads = t.fresh_int(1, 4)
    drawn = ModelConfig(arch="armt", vocab_size=t.fresh_int(64, 1024),
                        d_model=16 * heads * t.fresh_int(1, 4), n_layer=t.fresh_int(2, 10),
                        n_head=heads, seq_len=4096, segment_size=t.fresh_int(8, 256),
                        n_mem_tokens=t.fresh_int(1, 32), d_mem=t.fresh_int(4, 64))
    budget = t.fresh_int(50, 100) / 100
    for model_cfg in (MODEL, BIG, drawn):
        found = t.remote(flops_answers, dataclasses.asdict(model_cfg))
        for k in range(model_cfg.n_layer + 1):
            expected = metrics.flops_per_token(
                dataclasses.replace(model_cfg, memory_layers=tuple(range(k))))
            check_close(found[k], expected,
                        f"d={model_cfg.d_model}, {model_cfg.n_layer} layers, memory in {k}",
                        rtol=1e-9)
    big_chosen = t.remote(chosen_layers, dataclasses.asdict(BIG), [1.0, 0.95, 0.9, 0.5])
    [drawn_chosen] = t.remote(chosen_layers, dataclasses.asdict(drawn), [budget])
    check_equal(big_chosen[0], tuple(range(8)), "budget 1.0: every layer")
    check_equal(big_chosen[1], (3, 4, 5, 6, 7), "budget 0.95")
    check_equal(big_chosen[2], (6, 7), "budget 0.9")
    check_equal(big_chosen[3], (), "budget 0.5: not even one")
    check_equal(drawn_chosen, uppermost_within(drawn, budget),
                f"d={drawn.d_model}, {drawn.n_layer} layers, budget {budget}")
    model = build_model(dataclasses.replace(BIG, d_model=32, n_head=2, seq_len=256,
                                            segment_size=16, n_mem_tokens=2, d_mem=8,
                                            memory_layers=big_chosen[1]))
    check_equal(sorted(int(i) for i in model.memory), list(big_chosen[1]),
                "a model built with memory_layers=chosen wraps exactly those layers")


def measured_reach(detach_every: int, loss_segment: int, n_segments: int = 6,
                   seed: int = 0) -> tuple[list[int], torch.Tensor]:
    """Earlier segments whose embeddings get a non-zero gradient from a loss on
    ``loss_segment`` (segments of 8 tokens, tokens drawn from ``seed``), and the logits."""
    seed_everything(0)
    model_cfg = dataclasses.replace(MODEL, segment_size=8, seq_len=n_segments * 8,
                                    detach_every=detach_every)
    model = build_model(model_cfg).double()
    for layer in model.memory.values():          # W_V = 0 would carry nothing
        torch.nn.init.normal_(layer.w_v.weight, std=0.3)
    embeddings = []
    hook = model.backbone.embed.register_forward_hook(
        lambda module, args, out: embeddings.append(out) or out.retain_grad())
    tokens = torch.randint(0, 256, (2, n_segments * 8),
                           generator=torch.Generator().manual_seed(seed))
    targets = torch.full_like(tokens, IGNORE_INDEX)
    span = slice(loss_segment * 8, (loss_segment + 1) * 8)
    targets[:, span] = tokens.roll(-1, dims=1)[:, span]
    try:
        out = model(tokens, targets)
        out.loss.backward()
    finally:
        hook.remove()
    reached = [j for j in range(loss_segment) if embeddings[j].grad.abs().max() > 0]
    return reached, out.logits.detach()


@exercise_check("nb07-19", own_work={"segments_reached": (measured_reach,)})
def reach_check(t):
    """segments_reached against the segments whose embeddings a real model's loss reaches:
    detach_every 0, 2, 3 and one drawn anew, on tokens drawn anew; detaching leaves the
    forward pass unchanged."""
    segments_reached = t.answer("segments_reached")
    cases = [(k, s, 6, 0) for k in (0, 2, 3) for s in (5, 4, 3)]
    cases += [(t.fresh_int(2, 5), t.fresh_int(1, 7), 8, t.fresh_int(0, 1 << 30))]
    for k, s, n_segments, seed in cases:
        reached, _ = measured_reach(k, s, n_segments, seed)
        check_equal(segments_reached(s, k), reached,
                    f"detach_every={k}, loss on segment {s}" +
                    (f" of {n_segments}" if n_segments != 6 else "") + ": segments reached")
    _, full_logits = measured_reach(0, 4)
    _, cut_logits = measured_reach(2, 4)
    check_close(cut_logits, full_logits, "detaching leaves the forward pass unchanged")
