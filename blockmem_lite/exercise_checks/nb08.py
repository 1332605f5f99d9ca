"""The checks of exercises/08_moc_mixture_of_chapters.ipynb (see ``exercise_checks``)."""

from __future__ import annotations

import torch
import torch.nn as nn

from blockmem_lite.checks import CheckFailed, check_close, check_equal, check_true
from blockmem_lite.config import preset
from blockmem_lite.corpora import make_loaders
from blockmem_lite.exercise_checks import exercise_check
from blockmem_lite.exercise_checks.plugged import capstone, check_capstone
from blockmem_lite.models import build_model, moc
from blockmem_lite.plugged_in import Part, Probe, swap_modules
from blockmem_lite.runtime import seed_everything

MAX_CHAPTERS = 4096          # the most chapters a notebook's config may claim (a sanity bound)


def notebook_sizes(t) -> tuple[int, int]:
    """The notebook's ``n_chapters`` and ``top_k`` (its config's), in which its predicted
    values are formulas."""
    n_chapters, top_k = t.value("n_chapters"), t.value("top_k")
    whole = all(isinstance(v, int) and not isinstance(v, bool) for v in (n_chapters, top_k))
    if not (whole and 1 <= top_k and top_k + 2 <= n_chapters <= MAX_CHAPTERS):
        raise CheckFailed(f"n_chapters = {n_chapters!r}, top_k = {top_k!r} are not a MoC "
                          "config's: run the setup cell at the top of the notebook again (it "
                          "sets them from cfg.model)")
    return n_chapters, top_k


def chapter_weight_grads(t, probs: torch.Tensor, top_k: int, routed_scale: float) -> tuple:
    """Where the answers live: my_chapter_weights(probs, top_k, routed_scale) with ``probs``
    needing a gradient; returns its chapter ids and the gradient of the top routed chapter's
    summed weight with respect to ``probs`` (zero when no gradient reaches them)."""
    my_chapter_weights = t.answer("my_chapter_weights")
    leaf = probs.clone().requires_grad_()
    with torch.enable_grad():
        ids, weights = my_chapter_weights(leaf, top_k, routed_scale)
        if weights.requires_grad:
            weights[..., 1].sum().backward()      # the top routed chapter's weight
    grad = leaf.grad if leaf.grad is not None else torch.zeros_like(probs)
    return ids, grad


@exercise_check("nb08-05", own_work={"my_chapter_weights": (moc.chapter_weights,)})
def chapter_weights_check(t):
    """my_chapter_weights against moc.chapter_weights (S = 1), the rules for S = 2, and which
    probabilities get a gradient: the notebook's fast and class sizes and sizes drawn anew."""
    my_chapter_weights = t.answer("my_chapter_weights")
    gen = t.fresh_generator()
    drawn_k = t.fresh_int(2, 5)          # with k = 1 the top routed weight is a constant
    for n_chapters, top_k in ((17, 2), (257, 8), (t.fresh_int(drawn_k + 3, 40), drawn_k)):
        sizes = f"C={n_chapters}, k={top_k}"
        probs = torch.randn(4, 3, n_chapters, dtype=torch.float64,
                            generator=gen).softmax(-1)                      # (B, W, C)
        for scale in (2.5, 1.0):
            ids, weights = my_chapter_weights(probs, top_k, scale)
            lib_ids, lib_weights = moc.chapter_weights(probs, top_k, scale)
            check_equal(ids, lib_ids, f"{sizes}, S=1, routed_scale={scale}: chapters vs "
                        "moc.chapter_weights")
            check_close(weights, lib_weights, f"{sizes}, S=1, routed_scale={scale}: weights",
                        atol=1e-12)

        ids2, weights2 = my_chapter_weights(probs, top_k, 2.5, n_shared=2)
        check_equal(ids2[..., :2], torch.tensor([0, 1]).expand(4, 3, 2),
                    f"{sizes}, S=2: chapters 0 and 1 first")
        picks = ids2[..., 2:]                                               # (B, W, k)
        chosen = probs.gather(-1, picks.clamp(0, n_chapters - 1))
        left_out = probs.scatter(-1, picks.clamp(0, n_chapters - 1), -1.0)[..., 2:].amax(-1)
        check_true(bool((picks >= 2).all() & (chosen.amin(-1) >= left_out).all()),
                   f"{sizes}, S=2: the k picks are the most probable of chapters 2..C-1")
        check_true(bool((chosen[..., :-1] >= chosen[..., 1:]).all()),
                   f"{sizes}, S=2: the picks come largest first")
        check_close(weights2[..., :2], torch.full((4, 3, 2), 1 / 4.5, dtype=torch.float64),
                    f"{sizes}, S=2: each shared chapter weighs 1 / (2 + 2.5)", atol=1e-12)
        check_close(weights2.sum(-1), torch.ones(4, 3, dtype=torch.float64),
                    f"{sizes}, S=2: the weights of a decision sum to 1", atol=1e-12)
        check_close(weights2[..., 2:] / weights2[..., 2:].sum(-1, keepdim=True),
                    chosen / chosen.sum(-1, keepdim=True),
                    f"{sizes}, S=2: routed weights proportional to their probabilities",
                    atol=1e-12)

        ids, grad = t.remote(chapter_weight_grads, probs, top_k, 2.5)
        picked = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, ids[..., 1:], True)
        check_true(grad[~picked].abs().max() < 1e-12,
                   f"{sizes}: no gradient to chapters that were not picked")
        check_true(grad[picked].abs().min() > 1e-9,
                   f"{sizes}: a gradient to every picked chapter's probability")


@exercise_check("nb08-08", own_work={"my_load_balance": (moc.load_balance_loss,)})
def load_balance_check(t):
    """my_load_balance against moc.load_balance_loss (the notebook's sizes and sizes drawn
    anew), and the three predicted values against the kit's loss for those routers."""
    my_load_balance = t.answer("my_load_balance")
    n_chapters, top_k = notebook_sizes(t)
    gen = t.fresh_generator()
    drawn_k = t.fresh_int(1, 5)
    for chapters, k, n in ((n_chapters, top_k, 24),
                           (t.fresh_int(drawn_k + 2, 60), drawn_k, t.fresh_int(1, 40))):
        probs = torch.randn(n, chapters, dtype=torch.float64, generator=gen).softmax(-1)
        routed = moc.chapter_weights(probs, k, 2.5)[0][:, 1:]                  # (N, k)
        check_close(my_load_balance(probs, routed), moc.load_balance_loss(probs, routed),
                    "my_load_balance vs moc.load_balance_loss" +
                    ("" if chapters == n_chapters and n == 24 else
                     f" (C={chapters}, k={k}, N={n})"), atol=1e-12)

    n = 24
    uniform = torch.full((n, n_chapters), 1 / n_chapters, dtype=torch.float64)
    random_picks = torch.stack([torch.randperm(n_chapters - 1, generator=gen)[:top_k] + 1
                                for _ in range(n)])
    check_close(moc.load_balance_loss(uniform, random_picks), t.value("uniform_value"),
                "uniform router: L_lb = k")

    collapsed = torch.zeros(n, n_chapters, dtype=torch.float64)
    collapsed[:, 1:top_k + 1] = 1 / top_k
    same_picks = torch.arange(1, top_k + 1).expand(n, top_k)
    check_close(moc.load_balance_loss(collapsed, same_picks), t.value("collapsed_value"),
                "collapsed router: L_lb = C")

    parked = torch.zeros(n, n_chapters, dtype=torch.float64)
    parked[:, 0] = 1.0
    parked_picks = moc.chapter_weights(parked, top_k, 2.5)[0][:, 1:]
    parked_value = t.value("parked_value")
    check_close(moc.load_balance_loss(parked, parked_picks), parked_value,
                "parked router: L_lb = 0, below the uniform router's k")
    check_close(my_load_balance(parked, parked_picks), parked_value, "and with my_load_balance")


@exercise_check("nb08-12", own_work={"my_z_loss": (moc.z_loss,)})
def z_loss_check(t):
    """my_z_loss against moc.z_loss (the notebook's chapters and a shape drawn anew), and
    the two predicted values against the kit's z-loss of logits all 0 and all 3."""
    my_z_loss = t.answer("my_z_loss")
    n_chapters, _ = notebook_sizes(t)
    gen = t.fresh_generator()
    shape = (t.fresh_int(1, 5), t.fresh_int(1, 5), t.fresh_int(2, 40))
    for logits in (2 * torch.randn(4, 3, n_chapters, dtype=torch.float64, generator=gen),
                   2 * torch.randn(shape, dtype=torch.float64, generator=gen) + 1):
        check_close(my_z_loss(logits), moc.z_loss(logits), "my_z_loss vs moc.z_loss" +
                    ("" if logits.shape[-1] == n_chapters and logits.dim() == 3 and
                     logits.shape[:2] == (4, 3) else f" on logits {tuple(logits.shape)}"),
                    atol=1e-12)
    uniform_z, shifted_z = t.value("uniform_z"), t.value("shifted_z")
    zeros = torch.zeros(5, n_chapters, dtype=torch.float64)
    check_close(moc.z_loss(zeros), uniform_z, "uniform router: L_z = (ln C)^2")
    check_close(my_z_loss(zeros), uniform_z, "and with my_z_loss")
    check_close(moc.z_loss(zeros + 3), shifted_z, "logits all 3: L_z = (3 + ln C)^2")
    check_close((zeros + 3).softmax(-1), zeros.softmax(-1),
                "... although the probabilities did not change")


def routing_facts(chapters: torch.Tensor) -> tuple[dict, int, bool]:
    """For a (B, W, k+1) chapters trace: how many decisions read each routed chapter, how many
    decisions there are, and whether every sequence's window 0 reads the same chapters."""
    decisions = [set(row[1:]) for seq in chapters.tolist() for row in seq]
    n = int(chapters.max()) + 1
    reads = {c: sum(c in d for d in decisions) for c in range(1, max(n, 2))}
    return reads, len(decisions), len({tuple(seq[0]) for seq in chapters.tolist()}) == 1


def judge_routing(found: tuple, chapters: torch.Tensor, where: str = "") -> None:
    """read_routing's three values ``found`` for the trace ``chapters``."""
    most_used, fraction_most_used, window0_same_for_all = found
    reads, n_decisions, same = routing_facts(chapters)
    check_true(most_used != 0, f"{where}most_used is a routed chapter (chapter 0 is read by "
               "everyone)")
    check_true(most_used in reads, f"{where}most_used is a chapter of the trace",
               f"got {most_used!r}")
    check_equal(reads[most_used], max(reads.values()),
                f"{where}chapter {most_used} is read by the most decisions")
    check_close(fraction_most_used, reads[most_used] / n_decisions,
                f"{where}fraction of the {n_decisions} decisions that read it")
    check_equal(window0_same_for_all, same, f"{where}window0_same_for_all")


def drawn_trace(gen: torch.Generator, batch: int, windows: int, top_k: int, n_chapters: int,
                same_window0: bool) -> torch.Tensor:
    """A (batch, windows, top_k + 1) chapters trace: chapter 0 first, then top_k distinct
    routed chapters per decision; window 0 the same in every sequence if ``same_window0``."""
    routed = torch.rand(batch, windows, n_chapters - 1, generator=gen).argsort(-1)[..., :top_k]
    trace = torch.cat([torch.zeros(batch, windows, 1, dtype=torch.long), routed + 1], dim=-1)
    if same_window0:
        trace[:, 0] = trace[0, 0]
    return trace


MAX_TRACE = 1 << 16          # the most chapter ids a notebook's trace may hold (a sanity bound)


@exercise_check("nb08-18", own_work={"read_routing": (routing_facts, judge_routing)})
def routing_check(t):
    """The three values read from the notebook's trace, and read_routing on a planted trace
    and on two traces drawn anew (one whose window 0 is the same for every sequence)."""
    read_routing = t.answer("read_routing")
    chapters = t.value("chapters")
    if not (isinstance(chapters, torch.Tensor) and chapters.dim() == 3 and
            chapters.dtype == torch.long and 0 < chapters.numel() <= MAX_TRACE and
            chapters.shape[-1] >= 2 and bool((chapters >= 0).all())):
        raise CheckFailed("chapters is not the notebook's routing trace (a (B, W, k+1) tensor "
                          "of chapter ids): run the cell that traces the tiny model again")
    judge_routing((t.value("most_used"), t.value("fraction_most_used"),
                   t.value("window0_same_for_all")), chapters)

    planted = torch.tensor([[[0, 3, 5], [0, 3, 5], [0, 3, 5]],
                            [[0, 4, 6], [0, 3, 6], [0, 1, 2]]])   # (B=2, W=3, k+1=3), 7 chapters
    p_most, p_fraction, p_window0 = read_routing(planted, 7)
    check_equal(p_most, 3, "planted trace: chapter 3 is read most (4 of 6 decisions)")
    check_close(p_fraction, 4 / 6, "planted trace: fraction of the decisions that read chapter 3")
    check_equal(p_window0, False,
                "planted trace: window 0 reads {3, 5} in one sequence, {4, 6} in the other")

    gen = t.fresh_generator()
    top_k = t.fresh_int(1, 4)
    n_chapters = t.fresh_int(top_k + 3, 20)
    for same in (True, False):
        trace = drawn_trace(gen, t.fresh_int(2, 6), t.fresh_int(2, 6), top_k, n_chapters, same)
        judge_routing(read_routing(trace, n_chapters), trace,
                      f"drawn trace {tuple(trace.shape)}, {n_chapters} chapters: ")


# --- the capstone -----------------------------------------------------------------------------

CAP_CFG = preset("fast", arch="moc", memory_layers=(0, 1))          # both layers read the bank


def capstone_batches(seed: int | None = None, count: int = 8, rows: int = 8) -> list:
    """``count`` (tokens, targets) batches of ``rows`` training windows of the fast preset's
    corpus: the first ones in order, or drawn from ``seed``."""
    data = make_loaders(CAP_CFG)[0].dataset
    if seed is None:
        order = list(range(count * rows))
    else:
        gen = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(data), generator=gen)[:count * rows].tolist()
    pairs = [data[i] for i in order]
    return [(torch.stack([x for x, _ in pairs[j:j + rows]]),
             torch.stack([y for _, y in pairs[j:j + rows]])) for j in range(0, len(pairs), rows)]


def make_cap_model() -> nn.Module:
    """The kit's fast-mode MoC in float64, W_O random: a fresh W_O = 0 would hide the read."""
    seed_everything(0)
    model = build_model(CAP_CFG).double()
    for i in model.memory_layers:
        torch.nn.init.normal_(model.blocks[i].memory.out.weight, std=0.3)
    return model


def plug_in(t, model: nn.Module) -> int:
    """The student's block in place of every kit MoCBlock (the weights are shared)."""
    block_class = t.answer("MyMoCBlock")
    return swap_modules(model, moc.MoCBlock, lambda old: block_class(CAP_CFG.model).double())


MOC_PARTS = {
    "router": "window 0 is routed from block.route_start, window w from the mean of the states "
              "of all tokens before it (x entering the block), through W_r",
    "probs": "the scores match the kit's: look at the softmax (over the chapters, the last "
             "axis)",
    "chapters": "expected chapter 0 first, then the top-k of chapters 1..C-1, largest first",
    "weights": "expected shared 1 and routed routed_scale * (the top-k probabilities "
               "renormalised), all divided by their sum",
    "block": "the routing matches the kit's: look at the read of the chapters (gather, unit "
             "RMS, chapter weights, the cross-attention) or forward's residual steps",
}


def moc_parts(model: nn.Module, tokens: torch.Tensor) -> list[Part]:
    """Per memory layer, in order: the routing it returns (scores, probabilities, chapters,
    weights, one decision per window) and its output (B, T, D)."""
    found = []
    length, window = tokens.shape[1], CAP_CFG.model.routing_window
    windows = tuple(range(0, length, window))          # the first position each window reaches

    def watch(i: int):
        def hook(block, args, output):
            y, routing = output
            found.extend([
                Part(f"layer {i}: the router's scores", "router", routing.logits, windows,
                     "window"),
                Part(f"layer {i}: the router's probabilities", "probs", routing.probs, windows,
                     "window"),
                Part(f"layer {i}: the chapters read", "chapters", routing.chapter_ids.double(),
                     windows, "window"),
                Part(f"layer {i}: the chapter weights", "weights", routing.weights, windows,
                     "window"),
                Part(f"layer {i}: the block's output", "block", y, tuple(range(length)))])
        return hook

    handles = [model.blocks[i].register_forward_hook(watch(i)) for i in model.memory_layers]
    try:
        model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    return found


def explain_moc(part: Part, n, yours: torch.Tensor, kit: torch.Tensor) -> str:
    """What the first part of the student's block that differs points to."""
    if part.kind == "router" and n:
        return ("window 0's scores match the kit's: a later window's input is the mean of the "
                "states of all tokens before it (x entering the block), through W_r")
    return MOC_PARTS[part.kind]


MOC_PROBE = Probe(
    where=lambda position: f"window {position // CAP_CFG.model.routing_window}",
    parts=moc_parts, explain=explain_moc,
    training="is a stop-gradient missing or added? (the router learns through the picked "
             "chapters' weights and the auxiliary losses of the Routing you return)")

capstone("nb08-25", make_cap_model, plug_in, probe=MOC_PROBE)


@exercise_check("nb08-25", own_work={"MyMoCBlock": (
    moc.MoCBlock, moc.MemoryRead, moc.chapter_weights, moc.prefix_means, moc.gather_chapters,
    moc.token_weights, moc.reference_forward)})
def moc_block_check(t):
    """MyMoCBlock in both layers of a fast-mode MoC: the same logits, causal, the same loss
    curve over 8 training steps on windows drawn anew. Returns (the kit's curve, yours)."""
    return check_capstone(t, capstone_batches(seed=t.fresh_int(0, 1 << 30)), "MyMoCBlock")

