"""The checks of exercises/09_moc_knowledge_and_forgetting.ipynb (see ``exercise_checks``)."""

from __future__ import annotations

import math

import torch

from blockmem_lite import mechanisms
from blockmem_lite.checks import check_close, check_equal, check_true
from blockmem_lite.config import ModelConfig, TrainConfig, preset
from blockmem_lite.exercise_checks import exercise_check
from blockmem_lite.measure import flops, metrics
from blockmem_lite.models import build_model
from blockmem_lite.train import make_optimizer

KIT_FLOPS = (mechanisms.moc.moc_extra_flops, mechanisms.moc.route_every,
             flops.dense_layer_flops, metrics.flops_per_token, metrics.iso_flop_dense_config)


# --- exercise 1: the iso-FLOP dense depth ----------------------------------------------------


def iso_layers(t, configs: list) -> list:
    """Where the answers live: iso_flop_dense_layers of each config (``ModelConfig.to_dict``)."""
    iso_flop_dense_layers = t.answer("iso_flop_dense_layers")
    return [iso_flop_dense_layers(ModelConfig.from_dict(c)) for c in configs]


def drawn_config(t) -> ModelConfig:
    """A MoC config with every size of the FLOP model drawn anew."""
    n_layer, n_chapters = t.fresh_int(2, 8), t.fresh_int(3, 600)
    layers = tuple(i for i in range(n_layer) if t.fresh_int(0, 2) == 0) or (n_layer - 1,)
    return preset("class", arch="moc", d_model=16 * t.fresh_int(2, 12), n_layer=n_layer,
                  seq_len=16 * t.fresh_int(1, 32), n_chapters=n_chapters,
                  chapter_len=t.fresh_int(1, 32), top_k=t.fresh_int(1, min(64, n_chapters - 1)),
                  routing=("sequence", "block_causal")[t.fresh_int(0, 1)],
                  routing_window=t.fresh_int(1, 256), memory_layers=layers).model


@exercise_check("nb09-05", own_work={"memory_layer_extra_flops": KIT_FLOPS,
                                     "iso_flop_dense_layers": KIT_FLOPS})
def iso_flop_check(t):
    """memory_layer_extra_flops and iso_flop_dense_layers against the kit's FLOP model, on the
    presets' configs and one drawn anew."""
    memory_layer_extra_flops = t.answer("memory_layer_extra_flops")
    t.answer("iso_flop_dense_layers")                  # read by check_own_work before any call
    configs = {
        "this notebook (class preset, T = 128)": preset("class", arch="moc", seq_len=128).model,
        "fast": preset("fast", arch="moc").model,
        "class": preset("class", arch="moc").model,
        "gpu": preset("gpu", arch="moc").model,
        "class, sequence routing": preset("class", arch="moc", routing="sequence").model,
        "class, 2 memory layers, top-32": preset("class", arch="moc", memory_layers=(1, 3),
                                                 top_k=32).model,
        "class, routing window 8": preset("class", arch="moc", routing_window=8).model,
        "a config drawn anew": drawn_config(t),
    }
    for name, c in configs.items():
        route_every = mechanisms.moc.route_every(c, c.seq_len)
        check_close(memory_layer_extra_flops(c.d_model, c.n_chapters, c.top_k, c.chapter_len,
                                             route_every),
                    mechanisms.moc.moc_extra_flops(c.d_model, c.n_chapters, c.top_k,
                                                   c.chapter_len, route_every),
                    f"{name}: extra FLOPs of a memory layer")
    layers = t.remote(iso_layers, [c.to_dict() for c in configs.values()])
    for (name, c), mine in zip(configs.items(), layers, strict=True):
        check_equal(mine, metrics.iso_flop_dense_config(c).n_layer,
                    f"{name}: iso-FLOP dense layers")
    sizes = (t.fresh_int(8, 1024), t.fresh_int(2, 5000), t.fresh_int(1, 64), t.fresh_int(1, 64),
             t.fresh_int(1, 512))
    check_close(memory_layer_extra_flops(*sizes), mechanisms.moc.moc_extra_flops(*sizes),
                f"memory_layer_extra_flops{sizes} (sizes drawn anew)")


# --- exercise 2: learning-rate groups -------------------------------------------------------


def tiny_model(overrides: dict) -> torch.nn.Module:
    return build_model(preset("tiny", **{"arch": "moc", **overrides}))


def groups_of(t, overrides: dict, lr: float, weight_decay: float) -> list:
    """Where the answers live: lr_groups of a tiny MoC (``overrides`` applied), each group as
    (lr, weight decay, sorted names)."""
    lr_groups = t.answer("lr_groups")
    return [(g_lr, wd, sorted(names))
            for g_lr, wd, names in lr_groups(tiny_model(overrides), lr, weight_decay)]


def optimizer_groups(model, lr, weight_decay):
    """make_optimizer's groups in the same form, sorted."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    opt = make_optimizer(model, TrainConfig(lr=lr, weight_decay=weight_decay))
    return sorted((round(g["lr"], 12), g["weight_decay"],
                   sorted(name_of[id(p)] for p in g["params"])) for g in opt.param_groups)


@exercise_check("nb09-11", own_work={"lr_groups": (make_optimizer,)})
def lr_groups_check(t):
    """lr_groups against make_optimizer's groups on MoC and dense models, one with learning
    rates and scales drawn anew, and the bank's group at lr / 10."""
    cases = {
        "MoC, paper's fine-tuning scales": (dict(bank_lr_scale=0.1, memory_lr_scale=0.5), 1e-3,
                                            0.1),
        "MoC, frozen bank": (dict(freeze_bank=True, memory_lr_scale=0.5), 1e-3, 0.1),
        "MoC, defaults (bank and memory x2)": ({}, 1e-3, 0.1),
        "dense": (dict(arch="dense"), 1e-3, 0.1),
        "MoC, scales and rates drawn anew": (
            dict(bank_lr_scale=t.fresh_int(1, 40) / 10, memory_lr_scale=t.fresh_int(1, 40) / 10,
                 freeze_bank=bool(t.fresh_int(0, 1))), t.fresh_int(1, 99) * 1e-4,
            t.fresh_int(0, 20) / 100),
    }
    for name, (overrides, lr, weight_decay) in cases.items():
        mine = sorted((round(g_lr, 12), wd, names)
                      for g_lr, wd, names in t.remote(groups_of, overrides, lr, weight_decay))
        check_equal(mine, optimizer_groups(tiny_model(overrides), lr, weight_decay),
                    f"{name}: groups (lr, weight decay, names)")
    bank_group = [g for g in t.remote(groups_of, dict(bank_lr_scale=0.1), 3e-4, 0.1)
                  if "bank" in g[2]]
    check_equal(len(bank_group), 1, "the bank is in exactly one group")
    check_close(bank_group[0][0], 3e-5, "bank_lr_scale=0.1: the bank at lr/10", atol=1e-12,
                rtol=1e-9)


# --- exercise 3: forgetting -----------------------------------------------------------------

TABLE2 = {  # benchmark: (chance, (dense pretrain, dense IFT), (MoC pretrain, MoC IFT))
    "MMLU": (0.25, (0.2690, 0.2591), (0.2787, 0.2752)),
    "ARC-C": (0.25, (0.3177, 0.2508), (0.3144, 0.2876)),
    "BoolQ": (0.50, (0.5713, 0.5089), (0.6187, 0.6211)),
    "OBQA": (0.25, (0.3620, 0.3420), (0.3740, 0.3540)),
}
TABLE2_EXPECTED = {  # (dense drop pp, dense share lost, MoC drop pp, MoC share lost), 6 digits
    "MMLU": (0.99, 0.521053, 0.35, 0.121951), "ARC-C": (6.69, 0.988183, 2.68, 0.416149),
    "BoolQ": (6.24, 0.875175, -0.24, -0.020219), "OBQA": (2.0, 0.178571, 2.0, 0.16129),
}


def drop_and_share(before, after, chance):
    """(drop in percentage points, share of the above-chance score lost)."""
    return 100 * (before - after), (before - after) / (before - chance)


@exercise_check("nb09-15", own_work={"forgetting": (drop_and_share,)})
def forgetting_check(t):
    """forgetting on fixed cases, on scores drawn anew, and on the paper's Table 2."""
    forgetting = t.answer("forgetting")
    check_close(forgetting(0.8, 0.5, 0.1), (30.0, 3 / 7), "before 80%, after 50%, chance 10%")
    check_close(forgetting(0.7, 0.25, 0.25), (45.0, 1.0),
                "down to chance: all of the room above it lost")
    check_close(forgetting(0.6, 0.65, 0.5), (-5.0, -0.5), "an improvement is a negative drop")
    before, after, chance = (t.fresh_int(40, 95) / 100, t.fresh_int(5, 95) / 100,
                             t.fresh_int(0, 35) / 100)
    check_close(forgetting(before, after, chance), drop_and_share(before, after, chance),
                f"before {before:.0%}, after {after:.0%}, chance {chance:.0%} (drawn anew)")
    for bench_name, (chance, dense, moc_scores) in TABLE2.items():
        d_drop, d_share, m_drop, m_share = TABLE2_EXPECTED[bench_name]
        check_close([*forgetting(*dense, chance), *forgetting(*moc_scores, chance)],
                    list(TABLE2_EXPECTED[bench_name]), rtol=1e-5,  # expected values: 6 digits
                    name=f"Table 2, {bench_name}: dense {d_drop:+.2f} pp, {d_share:.0%} of its "
                         f"above-chance score lost; MoC {m_drop:+.2f} pp, {m_share:.0%}")


# --- exercise 4: drift ----------------------------------------------------------------------


def reference_drift(before: dict, after: dict, names) -> float:
    """||after - before|| / ||before|| over the tensors ``names``, in float64."""
    moved = sum(float(((after[n] - before[n]).double() ** 2).sum()) for n in names)
    size = sum(float((before[n].double() ** 2).sum()) for n in names)
    return math.sqrt(moved) / math.sqrt(size)


@exercise_check("nb09-21", own_work={"relative_drift": (reference_drift,)})
def drift_check(t):
    """relative_drift on small dicts (fixed and drawn anew), then the bank's and the
    backbone's drift in part a's two fine-tuning runs (``start``, ``ends``, ``backbone``)."""
    relative_drift = t.answer("relative_drift")
    before = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([[0.0], [4.0]])}
    after = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([[3.0], [8.0]])}
    check_close(relative_drift(before, after, ["a", "b"]), 1.0, "drift 5 on a vector of norm 5")
    check_close(relative_drift(before, after, ["a"]), 0.0, "an unchanged tensor does not drift")
    check_close(relative_drift(before, after, ["b"]), 5.0 / 4.0, "b alone: 5 / 4")
    check_close(relative_drift(before, {k: 2 * v for k, v in before.items()}, ["a", "b"]), 1.0,
                "doubling every value is a drift of 1")
    gen = t.fresh_generator()
    shapes = {"w": (t.fresh_int(1, 6), t.fresh_int(1, 6)), "v": (t.fresh_int(1, 9),),
              "u": (2, 3, t.fresh_int(1, 4)), "skipped": (3,)}
    drawn = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    moved = {n: x + t.fresh_int(1, 10) / 10 * torch.randn(x.shape, generator=gen)
             for n, x in drawn.items()}
    names = ["w", "v", "u"]
    check_close(relative_drift(drawn, moved, names), reference_drift(drawn, moved, names),
                f"tensors of shapes {[shapes[n] for n in names]} drawn anew, one left out")

    start, ends, backbone = t.value("start"), t.value("ends"), t.value("backbone")
    drift = {}
    for name, end in ends.items():
        drift[name] = {}
        for part, part_names in (("bank", ["bank"]), ("backbone", backbone)):
            mine = relative_drift({n: start[n] for n in part_names},
                                  {n: end[n] for n in part_names}, part_names)
            check_close(mine, reference_drift(start, end, part_names),
                        f"{name}: the {part}'s drift vs the kit's")
            drift[name][part] = mine
    frozen, trained = drift["bank frozen"], drift["bank trained (lr x1)"]
    check_equal(frozen["bank"], 0.0, "the frozen bank did not move at all")
    check_true(trained["bank"] > 0, f"the trained bank moved: drift {trained['bank']:.4f}")
    check_true(0 < frozen["backbone"] < 1 and 0 < trained["backbone"] < 1,
               f"backbone drift: {frozen['backbone']:.4f} with the bank frozen, "
               f"{trained['backbone']:.4f} with it trained")
