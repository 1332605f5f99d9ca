"""Every figure builder renders headless; the dashboards' three rows and the compare mode.

``CASES`` calls each public builder of the ``viz`` figure modules (mechanisms, training,
bench, charts) and of ``lab.figures`` with small valid inputs; each figure goes through
plotly's JSON export (validated), and two through a static PNG export when kaleido and a
browser are there. A builder added to any of these modules without a case here fails
``test_every_public_builder_has_a_render_case``; one the ``viz`` facade does not export
fails ``test_the_facade_exports_every_viz_builder``.
"""

import inspect
import json
import math

import numpy as np
import pytest
import torch

go = pytest.importorskip("plotly.graph_objects")

from blockmem_lite.lab import figures as lab_figures  # noqa: E402
from blockmem_lite.masks import block_causal_mask, cat_mask, causal_mask  # noqa: E402
from blockmem_lite.models.bcmt import decay_weights  # noqa: E402
from blockmem_lite.viz import bench, charts, common, dashboard, mechanisms, training  # noqa: E402
from blockmem_lite.viz.comparison import LiveComparison, live_comparison  # noqa: E402
from blockmem_lite.viz.dashboard import LiveDashboard  # noqa: E402


def shown(view):
    """The figure a view shows (filled in place, drawn whole at each redraw)."""
    return view.live_figure

# Public functions that are not figure builders (helpers, writers).
NOT_BUILDERS = {
    charts: set(),
    mechanisms: set(),
    training: {"run_family", "update_training_panels"},
    bench: set(),
    lab_figures: {"pareto_front", "pareto_points", "training_histories", "write_plots",
                  "recall_monitor", "partial_note"},
}


def history(n=10, base=3.0, mem_mib=200, grow_mib=0.0, val_every=5, method="process_rss"):
    steps = list(range(1, n + 1))
    return {"step": steps, "loss": [base - 0.1 * s for s in steps],
            "tokens_per_s": [1000.0 + s for s in steps],
            "memory_bytes": [(mem_mib + grow_mib * s / n) * 2**20 for s in steps],
            "elapsed_s": [0.5 * s for s in steps],
            "val_step": steps[val_every - 1::val_every],
            "val_loss": [base - 0.1 * s + 0.2 for s in steps[val_every - 1::val_every]],
            "memory_method": method, "total_steps": n, "interrupted": False}


def bench_records():
    return [{"arch": arch, "variant": None, "phase": phase, "seq_len": t,
             "tokens_per_s": 1e5 / t, "memory_bytes": t * 2**20,
             "memory_method": "process_rss", "state_bytes": t * 2**10}
            for arch in ("dense", "bcmt") for phase in ("train", "decode") for t in (64, 128)]


def lab_results():
    curve = [3.0 - 0.01 * s for s in range(20)]
    done = {"lm/dense": {"arch": "dense", "val_loss": {"": 3.0}, "loss_curve": curve,
                         "val_curve": [[10, 2.9], [20, 2.8]], "steps": 20},
            "lm/bcmt": {"arch": "bcmt", "val_loss": {"": 3.1}, "loss_curve": curve,
                        "val_curve": [[10, 3.0], [20, 2.9]], "steps": 20},
            "bench/*": {"records": [
                {"arch": "dense", "variant": "", "phase": "train", "seq_len": 64,
                 "ratio_vs_dense": None, "flop_ceiling": 1.0},
                {"arch": "bcmt", "variant": "", "phase": "train", "seq_len": 64,
                 "ratio_vs_dense": 1.5, "flop_ceiling": 1.2}],
                "state": {"dense": {"t": [64, 256], "measured": [100, 400],
                                    "analytic": [100, 400]}}},
            "recall/bcmt": {"arch": "bcmt", "local_span": {"": 8},
                            "chance": {"passkey": 0.1, "mqar": 0.05},
                            "curves": {"": {"mqar": [{"distance": 4, "accuracy": 0.9},
                                                     {"distance": 20, "accuracy": 0.2}]}},
                            "capacity": {"": [{"n_pairs": 1, "accuracy": 1.0}]},
                            "twin": {"curves": {"": {"mqar": [{"distance": 4, "accuracy": 0.8},
                                                              {"distance": 20,
                                                               "accuracy": 0.05}]}},
                                     "capacity": {"": [{"n_pairs": 1, "accuracy": 0.05}]}}}}
    return {"meta": {}, "done": done}


def decay(n, alpha):
    return decay_weights(n, alpha, torch.float64)


GREENS = go.Heatmap(colorscale="Greens").colorscale        # a named scale, as plotly resolves it
REDS = go.Heatmap(colorscale="Reds").colorscale

# name -> (call, expected trace types in order, check(fig) or None)
CASES = {
    mechanisms: {
        "mask_heatmap": (lambda: mechanisms.mask_heatmap(causal_mask(8), tokens=list("abcdefgh")),
                         ["heatmap"], lambda f: (
                             f.data[0].colorbar.ticktext == ("blocked", "may attend")
                             and "blue = may attend" in f.layout.title.text)),
        "mask_grid": (lambda: mechanisms.mask_grid({"dense": causal_mask(8),
                                                    "block 4": block_causal_mask(8, 4)}),
                      ["heatmap", "heatmap"], lambda f: f.data[1].showscale
                      and not f.data[0].showscale),
        "attention_heatmap": (lambda: mechanisms.attention_heatmap(torch.rand(2, 4, 4),
                                                                   colorscale="Greens",
                                                                   colorbar_title="p"),
                              ["heatmap", "heatmap"], lambda f: all(
                                  d.colorscale == GREENS for d in f.data)
                              and f.data[1].colorbar.title.text == "p"),
        "decay_heatmap": (lambda: mechanisms.decay_heatmap({a: decay(6, a) for a in (0.5, 1.0)}),
                          ["heatmap", "scatter", "heatmap", "scatter"],
                          lambda f: f.layout.coloraxis.colorscale
                          == go.layout.Coloraxis(colorscale="Viridis").colorscale),
        "summary_weights_heatmap": (lambda: mechanisms.summary_weights_heatmap(
            torch.softmax(torch.randn(3, 4), -1)), ["heatmap"], None),
        "gate_histogram": (lambda: mechanisms.gate_histogram({"l0": torch.rand(10)}),
                           ["histogram"], None),
        "memory_matrices": (lambda: mechanisms.memory_matrices({"a": torch.randn(4, 3)}),
                            ["heatmap"], None),
        "routing_heatmap": (lambda: mechanisms.routing_heatmap(torch.rand(3, 4),
                                                               torch.full((4,), 0.25)),
                            ["heatmap", "bar"], None),
        "routing_decisions": (lambda: mechanisms.routing_decisions(
            torch.tensor([[[0, 1], [0, 2]]]), torch.tensor([[[0.5, 0.5], [0.4, 0.6]]]), 3),
            ["heatmap"], None),
        "chapter_weights_bar": (lambda: mechanisms.chapter_weights_bar([0, 2], [0.4, 0.6]),
                                ["bar"], None),
    },
    training: {
        "loss_curves": (lambda: training.loss_curves({"dense": history(), "bcmt": history(6)}),
                        ["scatter"] * 4, None),
        "training_panels": (lambda: training.training_panels(["a", "b"], single=False),
                            ["scatter"] * 10, lambda f: all(len(d.x) == 0 for d in f.data)),
        "training_summary": (lambda: training.training_summary(history()), ["scatter"] * 5,
                             lambda f: f.layout.yaxis3.title.text == "MiB (RSS)"),
        "training_comparison": (lambda: training.training_comparison(
            {"a": history(), "b": history(base=2.5)}), ["scatter"] * 10, None),
    },
    bench: {
        "throughput_vs_length": (lambda: bench.throughput_vs_length(bench_records()),
                                 ["scatter"] * 4, None),
        "memory_vs_length": (lambda: bench.memory_vs_length(bench_records(), phase="train"),
                             ["scatter"] * 2, None),
    },
    charts: {
        "bar_compare": (lambda: charts.bar_compare({"dense": 1.0, "bcmt": 1.5}, reference=1.0),
                        ["bar"], None),
        "line_chart": (lambda: charts.line_chart({"a": ([1, 2], [3, 4])}), ["scatter"], None),
        "line_panels": (lambda: charts.line_panels({"A": {"a": ([1, 2], [3, 4])},
                                                    "B": {"a": ([1, 2], [5, 6])}}),
                        ["scatter"] * 2, None),
        "grouped_bars": (lambda: charts.grouped_bars({"x": {"a": 1.0}, "y": {"a": 2.0}}),
                         ["bar"] * 2, None),
        "scatter_points": (lambda: charts.scatter_points({"a": (1.0, 2.0)}), ["scatter"], None),
        "heatmap": (lambda: charts.heatmap(torch.rand(3, 4), colorscale="Reds",
                                           colorbar_title="v"),
                    ["heatmap"], lambda f: f.data[0].colorscale == REDS
                    and f.data[0].colorbar.title.text == "v"),
    },
    lab_figures: {
        "pareto": (lambda: lab_figures.pareto(lab_results()), ["scatter"] * 3, None),
        "state_vs_length": (lambda: lab_figures.state_vs_length(lab_results()),
                            ["scatter"] * 2, None),
        "recall_vs_distance": (lambda: lab_figures.recall_vs_distance(lab_results()),
                               ["scatter"] * 2, None),
        "recall_capacity": (lambda: lab_figures.recall_capacity(lab_results()),
                            ["scatter"] * 2, None),
        "facts_capacity": (lambda: lab_figures.facts_capacity({"knowledge": [
            {"entry": "moc", "baseline": "dense iso-FLOP (moc)", "n_facts": n, "recalled": r,
             "dense": r - 0.1, "floor": 0.1} for n, r in ((16, 1.0), (64, 0.8))]}),
            ["scatter"] * 3, lambda f: f.layout.xaxis.type == "log"
            and f.data[2].line.dash == "dash"),
        "memory_sweep": (lambda: lab_figures.memory_sweep(
            {"arch": "armt", "knob": "n_mem_tokens", "chance": 0.03, "points": {
                str(m): {"value": m,
                         "capacity": [{"n_pairs": 1, "accuracy": 0.9, "n_answers": 10}],
                         "slot_model": [{"n_pairs": 1, "slots": m, "accuracy": 1.0}]}
                for m in (1, 8)}}), ["scatter"] * 2, lambda f: f.layout.xaxis.type == "log"),
        "claims_overview": (lambda: lab_figures.claims_overview(
            [{"arch": "bcmt", "verdict": "reproduced"}]), ["bar"] * 5, None),
        "loss_by_position": (lambda: lab_figures.loss_by_position({"meta": {}, "done": {
            "lm/dense": {"arch": "dense", "val_loss": {"": 1.0},
                         "position_loss": {"": [2.0] * 16 + [1.5] * 16}},
            "lm/bcmt": {"arch": "bcmt", "val_loss": {"": 1.0}, "local_span": {"": 8},
                        "position_loss": {"": [2.0] * 16 + [1.4] * 16},
                        "position_loss_off": {"": [2.0] * 16 + [1.6] * 16}}}}),
            ["scatter"] * 3, lambda f: len(f.layout.shapes) == 3
            and [round(y, 2) for y in f.data[1].y] == [2.0, 2.0, 1.6, 1.6]),
        "training_curves": (lambda: lab_figures.training_curves(lab_results()),
                            ["scatter"] * 5, lambda f: len(f.layout.annotations) == 2),
    },
}


def public_builders(module) -> set:
    names = {n for n, f in inspect.getmembers(module, inspect.isfunction)
             if f.__module__ == module.__name__ and not n.startswith("_")}
    return names - NOT_BUILDERS[module]


@pytest.mark.parametrize("module", list(CASES), ids=lambda m: m.__name__)
def test_every_public_builder_has_a_render_case(module):
    assert public_builders(module) == set(CASES[module]), (
        "a public builder needs a render case in CASES (or, if it draws nothing, a place in "
        "NOT_BUILDERS)")


def test_the_facade_exports_every_viz_builder():
    import blockmem_lite.viz as viz

    for module in (mechanisms, training, bench, charts, common):
        names = {n for n, f in inspect.getmembers(module, inspect.isfunction)
                 if f.__module__ == module.__name__ and not n.startswith("_")}
        assert names <= set(viz.__all__), f"{module.__name__}: {names - set(viz.__all__)}"
        assert all(getattr(viz, n) is getattr(module, n) for n in names)


ALL_CASES = [(m, name) for m in CASES for name in CASES[m]]


@pytest.mark.parametrize("module,name", ALL_CASES, ids=[n for _, n in ALL_CASES])
def test_builder_renders_to_json_with_the_expected_traces(module, name):
    call, types, check = CASES[module][name]
    fig = call()
    assert isinstance(fig, go.Figure)
    assert [d.type for d in fig.data] == types
    exported = json.loads(fig.to_json(validate=True))          # what a front end receives
    assert [d.get("type", "scatter") for d in exported["data"]] == types
    if check is not None:
        assert check(fig)


def _png(fig, tmp_path):
    kaleido = pytest.importorskip("kaleido")
    del kaleido
    try:
        return fig.to_image(format="png", width=700, height=500)
    except Exception as exc:  # no browser, or one that cannot start here
        pytest.skip(f"static export is not possible here: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("name", ["mask_heatmap", "decay_heatmap"])
def test_two_builders_render_to_png_when_kaleido_works(name, tmp_path):
    png = _png(CASES[mechanisms][name][0](), tmp_path)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


# ----------------------------------------------------------------------------- heatmaps


def test_the_callers_colorscale_wins_even_when_set_afterwards():
    fig = mechanisms.attention_heatmap(cat_mask(3, 4).double(), title="(blue = may attend)")
    fig.update_traces(colorscale=[[0, "#eeeeee"], [1, "#3b6fb6"]], showscale=False)
    assert fig.data[0].colorscale == ((0, "#eeeeee"), (1, "#3b6fb6"))
    assert fig.layout.coloraxis.colorscale is None          # nothing at layout level overrides


def test_a_boolean_mask_is_two_colours_with_a_legend_matching_the_title():
    fig = mechanisms.attention_heatmap(cat_mask(3, 4), tokens=[f"t{i}" for i in range(16)])
    trace = fig.data[0]
    scale = [c for _, c in trace.colorscale]
    assert scale == [common.BLOCKED_COLOR] * 2 + [common.ALLOWED_COLOR] * 2   # no blend
    assert trace.colorbar.ticktext == ("blocked", "may attend") and trace.showscale
    assert "blue = may attend, grey = blocked" in fig.layout.title.text
    own = mechanisms.mask_heatmap(causal_mask(4), colors=("#ffffff", "#000000"),
                               labels=("hidden", "seen"))
    assert own.data[0].colorbar.ticktext == ("hidden", "seen")
    assert "blue" not in own.layout.title.text               # no colour names it cannot know
    with pytest.raises(ValueError, match="colors="):
        mechanisms.mask_heatmap(causal_mask(4), colors=("#fff",))


def test_heatmaps_grow_with_their_rows_and_thin_their_labels():
    small = mechanisms.attention_heatmap(torch.rand(16, 16), tokens=list("abcdefghijklmnop"))
    rows_px = small.layout.height - common.MARGIN_TOP - common.MARGIN_BOTTOM
    assert rows_px / 16 >= common.CELL_PX                   # 16 rows, 18 px each at least
    assert len(small.layout.yaxis.ticktext) == 16            # every label fits
    tokens = [f"tok{i}" for i in range(200)]
    big = mechanisms.attention_heatmap(torch.rand(200, 200), tokens=tokens)
    assert big.layout.height <= common.PANEL_MAX_PX + common.MARGIN_TOP + common.MARGIN_BOTTOM
    shown_y = big.layout.yaxis.ticktext
    assert len(shown_y) < 200 and common.PANEL_MAX_PX / len(shown_y) >= common.LABEL_PX
    shown_x = big.layout.xaxis.ticktext
    assert common.PLOT_WIDTH_PX / len(shown_x) >= 6 * common.CHAR_PX   # 'tok199' fits
    heads = mechanisms.attention_heatmap(torch.rand(8, 16, 16))
    assert heads.layout.height >= 2 * 16 * common.CELL_PX   # two rows of panels
    routing = charts.heatmap(np.zeros((40, 3)), y=[f"seq {i}" for i in range(40)])
    assert routing.layout.height >= 40 * common.CELL_PX


def test_heatmap_of_booleans_is_two_coloured():
    fig = charts.heatmap(np.eye(3, dtype=bool), labels=("off", "on"))
    assert fig.data[0].colorbar.ticktext == ("off", "on") and fig.data[0].zmax == 1


# ----------------------------------------------------------------------------- loss facets


FIVE = ["dense", "bcmt L=8", "bcmt L=16", "bcmt L=32", "honly"]


def test_many_runs_are_faceted_by_family_and_the_legend_shows_every_run():
    fig = training.loss_curves({n: history(base=3.0 - 0.1 * i) for i, n in enumerate(FIVE)})
    assert [a.text for a in fig.layout.annotations] == ["dense", "bcmt", "honly"]
    legend = [d.name for d in fig.data if d.showlegend is not False]
    assert legend == FIVE                                    # one entry per run, HOnly too
    assert fig.layout.legend.orientation == "h" and fig.layout.legend.y < 0
    assert fig.layout.legend.maxheight == 1.0                # wraps, never scrolls
    grey = [d for d in fig.data if d.name == "dense (reference)"]
    assert len(grey) == 2 and {d.xaxis for d in grey} == {"x2", "x3"}
    honly = [d for d in fig.data if d.legendgroup == "honly"]
    assert {d.xaxis for d in honly} == {"x3"} and len({d.line.color for d in honly}) == 1
    colours = {d.line.color for d in fig.data if d.showlegend is not False}
    assert len(colours) == 5


def test_loss_curves_facet_choices():
    hs = {n: history() for n in FIVE}
    assert len(training.loss_curves(hs, facet=None).layout.annotations) == 0
    two = training.loss_curves(hs, facet={n: "memory" if "bcmt" in n else "none" for n in FIVE},
                              reference=None)
    assert [a.text for a in two.layout.annotations] == ["none", "memory"]
    assert not [d for d in two.data if "reference" in d.name]
    assert training.run_family("MoC, frozen bank") == "MoC"
    assert training.run_family("dense (iso-FLOP)") == "dense"
    with pytest.raises(ValueError, match="facet is not allowed"):
        training.loss_curves(hs, facet={"dense": "a"})
    with pytest.raises(ValueError, match="reference='gpt'"):
        training.loss_curves(hs, facet="family", reference="gpt")


# ----------------------------------------------------------------------------- dashboards


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def rec(step, total=40, mib=400.0):
    return {"step": step, "total_steps": total, "loss": 4.0 / step, "tokens_per_s": 100.0 * step,
            "memory_bytes": (mib + step) * 2**20, "memory_method": "process_rss",
            "elapsed_s": 0.5 * step, "eta_s": 0.5 * (total - step)}


def feed(callback, clock, n, total=40, mib=400.0, end=True):
    for step in range(1, n + 1):
        clock.now += 0.3                                      # above the 4/s throttle
        callback.on_step(None, rec(step, total, mib))
        if step % 10 == 0:
            callback.on_eval(None, {"step": step, "total_steps": total, "val_loss": 3.0 / step})
    if end:
        callback.on_end(None, None)


def widget_or_skip(cls, **kwargs):
    try:
        return cls(mode="widget", **kwargs)
    except RuntimeError as exc:
        pytest.skip(f"widgets cannot be built in this process: {exc}")


def test_dashboard_widget_fills_three_rows_as_steps_come_in_with_the_eta():
    clock = FakeClock()
    dash = widget_or_skip(LiveDashboard, total_steps=40, title="tiny", clock=clock)
    fig = dash.live_figure
    assert len(fig.data) == 5 and all(len(d.x) == 0 for d in fig.data)
    feed(dash, clock, 12, end=False)
    train, val, speed, memory, peak = fig.data
    assert {train.yaxis, val.yaxis, speed.yaxis, memory.yaxis} == {"y", "y2", "y3"}
    assert len(train.x) == len(speed.x) == len(memory.x) == 12 and tuple(val.x) == (10,)
    assert memory.y[-1] == pytest.approx(412.0) and tuple(peak.y) == pytest.approx((412, 412))
    assert fig.layout.yaxis3.title.text == "MiB (RSS)"
    lo, hi = fig.layout.yaxis3.range
    assert 395 < lo < 401 and 412 < hi < 420                 # 12 MiB of growth is visible
    assert "step 12/40" in fig.layout.title.text and "about 14 s left" in fig.layout.title.text
    assert "left" in dash._status.value
    feed(dash, clock, 40)                                     # a new run: starts over
    assert len(fig.data[0].x) == 40 and "done: step 40/40" in fig.layout.title.text


def test_comparison_overlays_n_runs_in_n_colours_in_one_widget():
    clock = FakeClock()
    names = ["dense", "bcmt L=8", "honly"]
    cmp_ = widget_or_skip(LiveComparison, runs=names, total_steps=20, title="three", clock=clock)
    fig = cmp_.live_figure
    assert len(fig.data) == 15                               # five slots per declared run
    for i, name in enumerate(names[:2]):
        feed(cmp_.run(name), clock, 20, total=20, mib=400.0 + 50 * i)
    feed(cmp_.run("honly"), clock, 5, total=20, end=False)
    trains = fig.data[0::5]
    assert [t.name for t in trains] == names and all(t.showlegend for t in trains)
    assert len({t.line.color for t in trains}) == 3
    for i, name in enumerate(names):
        slots = fig.data[5 * i:5 * i + 5]
        assert {d.legendgroup for d in slots} == {name}       # one legend click hides the run
        assert len({d.line.color for d in slots}) == 1
        assert not any(d.showlegend for d in slots[1:])
    assert len(fig.data[10].x) == 5 and len(fig.data[0].x) == 20
    title = fig.layout.title.text
    assert "run 3 of 3: honly" in title and "left" in title
    status = cmp_._status.value
    assert all(f"<b>{html_name}</b>" in status for html_name in ("dense", "bcmt L=8", "honly"))
    assert status.count("<tr>") == 3 and "done: step 20/20" in status
    assert set(cmp_.histories) == set(names)
    static = cmp_.figure()
    assert len(static.data) == 15 and len({d.line.color for d in static.data[0::5]}) == 3
    assert len(cmp_.loss_figure(facet=None).data) == 5      # train + val, honly has no val yet


def test_comparison_adds_a_run_it_was_not_told_about():
    clock = FakeClock()
    cmp_ = widget_or_skip(LiveComparison, clock=clock)
    feed(cmp_.run("late"), clock, 3)
    assert len(shown(cmp_).data) == 5 and shown(cmp_).data[0].name == "late"


def test_comparison_text_mode_prefixes_each_line_with_its_run(monkeypatch, capsys):
    monkeypatch.setenv("BLOCKMEM_HEADLESS", "1")
    clock = FakeClock()
    cmp_ = LiveComparison(runs=["dense", "bcmt"], total_steps=40, clock=clock, print_every_s=5)
    assert cmp_.mode == "text"
    feed(cmp_.run("dense"), clock, 40)
    feed(cmp_.run("bcmt"), clock, 40)
    lines = capsys.readouterr().out.strip().splitlines()
    assert all(ln.startswith(("[dense] ", "[bcmt] ")) for ln in lines)
    assert lines[0].startswith("[dense] step  1/40") and lines[-1].startswith("[bcmt] done:")
    assert sum(ln.startswith("[bcmt] step") for ln in lines) <= math.ceil(40 * 0.3 / 5) + 1
    assert sum("eval" in ln for ln in lines) == 8
    assert cmp_.histories["bcmt"]["step"][-1] == 40          # the points (no History sent)
    with pytest.raises(ValueError, match="name="):
        cmp_.run("")


def test_live_comparison_takes_step_counts_from_configs(monkeypatch, tiny_cfg):
    monkeypatch.setenv("BLOCKMEM_HEADLESS", "1")
    cmp_ = live_comparison({"a": tiny_cfg, "b": tiny_cfg.replace(steps=7)})
    assert cmp_.records["a"].total == tiny_cfg.train.steps and cmp_.records["b"].total == 7
    with pytest.raises(ValueError, match="total_steps"):
        LiveComparison(total_steps={"a": 0}, mode="text")
    with pytest.raises(ValueError, match="runs="):
        LiveComparison(runs="dense", mode="text")
    with pytest.raises(ValueError, match="before a run"):
        LiveComparison(mode="text").figure()


def test_comparison_is_exported_like_the_dashboard():
    import blockmem_lite.viz as viz

    assert viz.LiveComparison is LiveComparison and viz.live_comparison is live_comparison
    assert dashboard.RunRecord().as_history()["step"] == []


def test_the_comparison_feeds_a_real_trainer(monkeypatch, tiny_cfg):
    from blockmem_lite import build_model
    from blockmem_lite.train import Trainer

    monkeypatch.setenv("BLOCKMEM_HEADLESS", "1")
    cfg = tiny_cfg.replace(steps=3, eval_every=3)
    data = torch.randint(0, cfg.model.vocab_size, (8, cfg.model.seq_len + 1))
    windows = [(row[:-1], row[1:]) for row in data]
    cmp_ = live_comparison({"one": cfg}, print_every_s=100)
    history_out = Trainer(build_model(cfg), cfg, windows, windows,
                          callbacks=[cmp_.run("one")]).fit()
    assert cmp_.histories["one"] is history_out
    fig = cmp_.figure()
    assert len(fig.data[0].x) == 3 and fig.layout.yaxis3.title.text.startswith("MiB (")


def test_a_new_builder_without_a_render_case_is_caught(monkeypatch):
    def new_plot():
        return go.Figure()

    new_plot.__module__ = charts.__name__
    monkeypatch.setattr(charts, "new_plot", new_plot, raising=False)
    assert public_builders(charts) - set(CASES[charts]) == {"new_plot"}
