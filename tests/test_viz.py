"""Figure builders and the live dashboard (text mode, widget mode, fallback, throttling)."""

import math
import sys

import numpy as np
import pytest
import torch

from blockmem_lite.masks import block_causal_mask, causal_mask
from blockmem_lite.units import format_progress

go = pytest.importorskip("plotly.graph_objects")

from blockmem_lite import viz  # noqa: E402
from blockmem_lite.viz import live_base  # noqa: E402
from blockmem_lite.viz.comparison import LiveComparison  # noqa: E402
from blockmem_lite.viz.dashboard import LiveDashboard, live_dashboard  # noqa: E402


class FakeClock:
    """A monotonic clock the test advances by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def step_rec(step, total=2000, elapsed=None):
    return {"step": step, "total_steps": total, "loss": 5.0 / step, "ce_loss": 5.0 / step,
            "aux_loss": 0.0, "lr": 1e-3, "tokens_per_s": 1234.0, "memory_bytes": 400e6 + step,
            "memory_method": "process_rss", "elapsed_s": elapsed if elapsed is not None else
            step * 1e-3, "eta_s": 1.0}


def history_dict(n=10, interrupted=False):
    steps = list(range(1, n + 1))
    return {"step": steps, "loss": [3.0 - 0.1 * s for s in steps],
            "tokens_per_s": [1000.0] * n, "memory_bytes": [200 * 2**20] * n,
            "elapsed_s": [0.5 * s for s in steps], "val_step": [5, 10], "val_loss": [2.7, 2.2],
            "memory_method": "process_rss", "total_steps": 20, "interrupted": interrupted}


@pytest.fixture
def headless(monkeypatch):
    monkeypatch.setenv("BLOCKMEM_HEADLESS", "1")


# ----------------------------------------------------------------------------- light imports


def test_importing_the_package_does_not_import_plotly_or_widgets():
    import subprocess

    code = ("import sys, blockmem_lite, blockmem_lite.viz, blockmem_lite.viz.dashboard, "
            "blockmem_lite.viz.comparison, blockmem_lite.viz.monitor, blockmem_lite.viz.widgets; "
            "print(any(m in sys.modules for m in ('plotly', 'ipywidgets', 'IPython')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


# ----------------------------------------------------------------------------- masks


def test_mask_heatmap_keeps_orientation_queries_down_keys_across():
    mask = causal_mask(3, 5)                       # (Tq=3, Tk=5): last 3 queries of 5 keys
    fig = viz.mask_heatmap(mask, title="cache")
    assert isinstance(fig, go.Figure) and len(fig.data) == 1
    z = np.asarray(fig.data[0].z)
    assert z.shape == (3, 5)                       # rows are queries, columns keys
    np.testing.assert_array_equal(z, mask.numpy().astype(int))
    assert z[0, 2] == 1 and z[0, 3] == 0           # query 0 sits at position 2 of 5
    assert fig.layout.yaxis.autorange == "reversed"
    assert fig.layout.xaxis.title.text == "key position"
    assert fig.layout.yaxis.title.text == "query position"
    assert "cache" in fig.layout.title.text and "80%" in fig.layout.title.text


def test_mask_heatmap_rejects_a_1d_mask():
    with pytest.raises(ValueError, match="mask"):
        viz.mask_heatmap(torch.ones(4, dtype=torch.bool))


def test_mask_grid_puts_masks_side_by_side():
    fig = viz.mask_grid({"dense": causal_mask(16), "block 4": block_causal_mask(16, 4)})
    assert len(fig.data) == 2
    assert fig.data[0].xaxis == "x" and fig.data[1].xaxis == "x2"
    np.testing.assert_array_equal(np.asarray(fig.data[1].z), block_causal_mask(16, 4).int())
    assert fig.layout.yaxis.autorange == "reversed" and fig.layout.yaxis2.autorange == "reversed"
    titles = [a.text for a in fig.layout.annotations]
    assert any("dense" in t for t in titles) and any("block 4" in t for t in titles)


# ----------------------------------------------------------------------------- attention


def test_attention_heatmap_one_subplot_per_head_with_token_labels():
    weights = torch.softmax(torch.randn(3, 4, 4), dim=-1)   # (H, Tq, Tk)
    fig = viz.attention_heatmap(weights, tokens=["a", " ", "\n", "b"])
    assert len(fig.data) == 3
    np.testing.assert_allclose(np.asarray(fig.data[2].z), weights[2].numpy(), rtol=1e-6)
    assert fig.layout.xaxis.ticktext == ("a", "␣", "⏎", "b")
    assert fig.layout.yaxis3.autorange == "reversed"


def test_attention_heatmap_limits_heads_and_accepts_batches():
    weights = torch.rand(2, 6, 3, 5)                         # (B, H, Tq, Tk)
    fig = viz.attention_heatmap(weights, max_heads=4, batch_index=1,
                                    tokens=list("abcde"))
    assert len(fig.data) == 4
    np.testing.assert_allclose(np.asarray(fig.data[0].z), weights[1, 0].numpy(), rtol=1e-6)
    assert "first 4 of 6 heads" in fig.layout.title.text
    assert fig.layout.yaxis.ticktext == ("c", "d", "e")      # queries: the last 3 keys
    single = viz.attention_heatmap(torch.rand(4, 4))
    assert len(single.data) == 1


def test_attention_heatmap_rejects_wrong_token_count():
    with pytest.raises(ValueError, match="tokens"):
        viz.attention_heatmap(torch.rand(4, 4), tokens=["a", "b"])


# ----------------------------------------------------------------------------- training


def test_loss_curves_train_line_and_val_markers_per_run():
    fig = viz.loss_curves({"dense": history_dict(), "bcmt": history_dict(6)})
    assert len(fig.data) == 4
    train, val = fig.data[0], fig.data[1]
    assert train.mode == "lines" and "markers" in val.mode
    assert train.line.color == val.line.color != fig.data[2].line.color
    assert tuple(val.x) == (5, 10) and tuple(val.y) == (2.7, 2.2)


def test_loss_curves_x_in_time_and_tokens():
    h = history_dict()
    by_time = viz.loss_curves({"r": h}, x="time")
    assert tuple(by_time.data[1].x) == (2.5, 5.0)           # val steps 5, 10 at 0.5 s/step
    by_tokens = viz.loss_curves({"r": h}, x="tokens", tokens_per_step=100)
    assert tuple(by_tokens.data[0].x)[:2] == (100, 200)
    with pytest.raises(ValueError, match="tokens_per_step"):
        viz.loss_curves({"r": h}, x="tokens")
    with pytest.raises(ValueError, match="x='epoch'"):
        viz.loss_curves({"r": h}, x="epoch")


def test_loss_curves_read_history_objects_by_attribute():
    class Hist:
        pass

    h = Hist()
    for key, value in history_dict().items():
        setattr(h, key, value)
    fig = viz.loss_curves({"obj": h})
    assert tuple(fig.data[0].y) == tuple(history_dict()["loss"])


def test_training_summary_has_loss_throughput_and_memory_panels():
    fig = viz.training_summary(history_dict(interrupted=True), title="run A")
    assert len(fig.data) == 5                                # train, val, tokens/s, memory, peak
    assert (fig.data[0].name, fig.data[1].name) == ("train loss", "val loss")
    assert fig.data[0].line.color != fig.data[1].marker.color  # val stands out on the line
    assert tuple(fig.data[2].y) == (1000.0,) * 10            # tokens/s
    assert tuple(fig.data[3].y) == (200.0,) * 10             # MiB
    assert tuple(fig.data[4].y) == (200.0, 200.0) and fig.data[4].line.dash == "dot"
    assert fig.layout.yaxis3.title.text == "MiB (RSS)"
    lo, hi = fig.layout.yaxis3.range                         # around the readings, not 0..200
    assert 190 < lo < 200 < hi < 210
    title = fig.layout.title.text
    assert "interrupted" in title and "run A" in title
    assert "median 1.0k tok/s" in title and "peak 200 MiB RSS" in title
    assert fig.data[3].yaxis == "y3" and fig.data[2].yaxis == "y2" and fig.data[0].yaxis == "y"


def test_training_summary_memory_that_grows_is_not_a_flat_line():
    h = history_dict()
    h["memory_bytes"] = [(400 + s) * 2**20 for s in h["step"]]       # 401 .. 410 MiB
    lo, hi = viz.training_summary(h).layout.yaxis3.range
    assert lo > 390 and hi < 420                             # 9 MiB of growth fills the panel


# ----------------------------------------------------------------------------- benchmarks


def bench_records():
    recs = []
    for arch, variant in (("dense", None), ("bcmt", "L=64")):
        for phase in ("train", "decode"):
            for seq_len in (512, 128, 256):
                recs.append({"arch": arch, "variant": variant, "phase": phase,
                             "seq_len": seq_len, "tokens_per_s": 1e6 / seq_len,
                             "memory_bytes": seq_len * 2**20, "memory_method": "cuda_max_allocated",
                             "state_bytes": seq_len * 2**11})
    return recs


def test_throughput_vs_length_one_line_per_arch_variant_and_phase():
    fig = viz.throughput_vs_length(bench_records())
    assert len(fig.data) == 4
    assert {d.name for d in fig.data} == {"dense · train", "dense · decode",
                                          "bcmt / L=64 · train", "bcmt / L=64 · decode"}
    assert tuple(fig.data[0].x) == (128, 256, 512)           # sorted by length
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    one_phase = viz.throughput_vs_length(bench_records(), phase="train")
    assert [d.name for d in one_phase.data] == ["dense", "bcmt / L=64"]


def test_memory_vs_length_names_the_method_and_converts_to_mib():
    fig = viz.memory_vs_length(bench_records(), phase="train")
    assert len(fig.data) == 2
    assert tuple(fig.data[0].y) == (128.0, 256.0, 512.0)
    assert fig.layout.yaxis.title.text == "peak memory (MiB, CUDA peak)"
    state = viz.memory_vs_length(bench_records(), key="state_bytes", phase="decode")
    assert tuple(state.data[1].y) == pytest.approx((0.25, 0.5, 1.0))
    with pytest.raises(ValueError, match="phase='prefill'"):
        viz.memory_vs_length(bench_records(), phase="prefill")
    with pytest.raises(ValueError, match="key="):
        viz.memory_vs_length(bench_records(), key="flops")


def test_memory_axis_titles_use_the_shared_method_labels():
    assert viz.memory_method_label("saved_tensors") == "saved for backward"
    assert viz.memory_method_label(None) == "unknown method"
    records = [{**r, "memory_method": None} for r in bench_records()]
    fig = viz.memory_vs_length(records, phase="train")
    assert fig.layout.yaxis.title.text == "peak memory (MiB, unknown method)"


def test_bar_compare_with_reference_line():
    fig = viz.bar_compare({"dense": 1.0, "bcmt": 1.7}, reference=1.0)
    assert len(fig.data) == 1 and tuple(fig.data[0].y) == (1.0, 1.7)
    assert len(fig.layout.shapes) == 1


# ----------------------------------------------------------------------------- dashboard


def test_bad_mode_and_rates_are_rejected():
    with pytest.raises(ValueError, match="mode='gui'"):
        LiveDashboard(mode="gui")
    with pytest.raises(ValueError, match="max_updates_per_s"):
        LiveDashboard(mode="text", max_updates_per_s=0)
    with pytest.raises(ValueError, match="total_steps"):
        LiveDashboard(total_steps=0, mode="text")


def test_text_lines_are_the_trainers_progress_lines(headless, capsys):
    dash = LiveDashboard(total_steps=600, clock=FakeClock())
    rec = step_rec(100, total=600, elapsed=83.0)
    dash.on_step(None, rec)
    dash.on_eval(None, {"step": 100, "val_loss": 1.5, "elapsed_s": 83.0})
    step_line, eval_line = capsys.readouterr().out.strip().splitlines()
    assert step_line == format_progress(rec)
    assert "1.2k tok/s" in step_line and "mem 381 MiB RSS" in step_line
    assert "1:23 elapsed" in step_line
    assert eval_line == "eval step 100/600 | val_loss 1.5000 | 1:23 elapsed"


def run_steps(dash, clock, n, dt=1e-3, eval_every=500, total=2000):
    for step in range(1, n + 1):
        clock.now += dt
        dash.on_step(None, step_rec(step, total))
        if step % eval_every == 0:
            dash.on_eval(None, {"step": step, "total_steps": total, "val_loss": 1.0 / step,
                                "elapsed_s": step * dt})


def test_text_mode_throttles_prints_and_reports_eval_and_end(headless, capsys):
    clock = FakeClock()
    dash = LiveDashboard(total_steps=2000, title="dense", clock=clock)
    assert dash.mode == "text" and dash.fallback_reason is None
    run_steps(dash, clock, 2000)                             # 2 s of fake time
    dash.on_end(None, {**history_dict(), "interrupted": False})
    lines = capsys.readouterr().out.strip().splitlines()
    eval_lines = [ln for ln in lines if ln.startswith("[dense] eval step")]
    assert len(eval_lines) == 4 and "0.0020" in eval_lines[0]      # val loss at step 500
    step_lines = len(lines) - len(eval_lines) - 1
    assert 1 <= step_lines <= 3                              # every 2 s, not 2000 lines
    assert lines[-1].startswith("[dense] done: step 2000/2000")
    assert "val loss 0.0005" in lines[-1] and "peak 381 MiB RSS" in lines[-1]
    assert all(ln.startswith("[dense] ") for ln in lines)


def test_text_mode_final_line_says_interrupted(headless, capsys):
    clock = FakeClock()
    dash = live_dashboard(mode="auto", clock=clock)
    run_steps(dash, clock, 30, total=100)
    dash.on_end(None, history_dict(interrupted=True))
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("interrupted at step 30/100")


def test_headless_wins_over_a_working_widget(headless, monkeypatch):
    monkeypatch.setattr(live_base, "_in_notebook_kernel", lambda: True)
    assert LiveDashboard().mode == "text"


def without_ipywidgets(monkeypatch):
    """A kernel without ipywidgets: importing it fails."""
    monkeypatch.delenv("BLOCKMEM_HEADLESS", raising=False)
    monkeypatch.setattr(live_base, "_in_notebook_kernel", lambda: True)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)


def test_auto_falls_back_to_text_without_ipywidgets(monkeypatch, capsys):
    without_ipywidgets(monkeypatch)
    dash = LiveDashboard(total_steps=10)
    assert dash.mode == "text" and dash.widget is None
    assert "ipywidgets" in dash.fallback_reason
    dash.on_step(None, step_rec(1, total=10))
    out = capsys.readouterr().out
    assert "widgets unavailable" in out and out.count("\n") == 2
    with pytest.raises(RuntimeError, match="ipywidgets"):
        LiveDashboard(mode="widget")


def test_live_views_never_build_a_figurewidget(monkeypatch):
    """A FigureWidget ships its own 5 MB plotly.js with every chart and into the saved
    notebook, and draws nothing until the browser compiled it: the views draw plain
    figures into an Output instead (live_base.FigureArea)."""
    def refused(*args, **kwargs):
        raise AssertionError("a live view built a FigureWidget")

    monkeypatch.setattr(go, "FigureWidget", refused)
    clock = FakeClock()
    views = [widget_dashboard(total_steps=20, clock=clock),
             LiveComparison(runs=["a"], total_steps=20, mode="widget", clock=clock),
             LiveMonitor(lambda t, r: {"a": 1, "b": 2}, bars, mode="widget", clock=clock)]
    for view in views[:2]:
        run_steps(view if view is views[0] else view.run("a"), clock, 20, total=20)
    monitor_run(views[2], clock, total=20, dt=0.5)
    for view in views:
        assert type(view.widget).__name__ in ("VBox", "Output")
        assert type(view.live_figure) is go.Figure and len(view.live_figure.data) >= 1


class FakeHandle:
    """An IPython display handle that notes what replaced its output."""

    def __init__(self, obj, log):
        self.log = log
        log.append(("display", obj))

    def update(self, obj, raw=False):
        self.log.append(("update", obj))


def test_the_figure_area_draws_whole_figures_then_settles_as_a_plain_output(monkeypatch):
    """In a kernel each drawing replaces the last inside the Output (clear_output(wait=True),
    then display); at the end the last figure replaces the widget as a plain output, so a
    reopened notebook shows it without widget state. Outside a kernel nothing is shown."""
    pytest.importorskip("ipywidgets")
    import plotly.io as pio

    monkeypatch.setattr(pio.renderers, "default", "json")     # a bundle without random div ids
    area = live_base.FigureArea()
    first = viz.bar_compare({"a": 1.0})
    area.show()
    area.draw(first)                                           # outside a kernel: kept only
    area.settle()
    assert area.figure is first and not area.settled
    log = []
    monkeypatch.setattr(live_base, "_in_notebook_kernel", lambda: True)
    monkeypatch.setattr(live_base, "_display", lambda obj: FakeHandle(obj, log))
    monkeypatch.setattr(type(area.widget), "clear_output",
                        lambda self, wait=False: log.append(("clear", wait)))
    monkeypatch.setattr("IPython.display.display", lambda fig: log.append(("draw", fig)))
    area.show()
    second = viz.line_chart({"x": ([1, 2], [3, 4])}).update_layout(height=300)
    area.draw(second)
    area.settle()
    area.draw(first)                                           # a new run: live again
    assert log == [("display", area.widget), ("clear", True), ("draw", second),
                   ("update", second._repr_mimebundle_()), ("clear", False),
                   ("update", area.widget), ("clear", True), ("draw", first)]
    assert area.widget.layout.min_height == "300px" and not area.settled
    status = live_base.StatusLine("<b>a</b>")
    status.show()
    status.update("<b>a</b>")                                  # unchanged: nothing sent
    status.update("<b>b</b>")
    shown = [obj.data for kind, obj in log[-2:]]
    assert shown == [f'<div class="{live_base.STATUS_CLASS}"><b>a</b></div>',
                     f'<div class="{live_base.STATUS_CLASS}"><b>b</b></div>']


def test_time_left_never_reads_as_a_clock_time():
    from blockmem_lite.units import duration_words, time_left

    assert time_left(1148) == "about 19 min 08 s left"
    assert time_left(42.4) == "about 42 s left" and time_left(3725) == "about 1 h 02 min left"
    assert time_left(None) == "time left unknown" and duration_words(float("nan")) == "?"
    dash = LiveDashboard(total_steps=2000, mode="text")
    dash.on_step(None, {**step_rec(10), "elapsed_s": 83.0, "eta_s": 1148.0})
    assert dash.record.progress_text() == "step 10/2000 · about 19 min 08 s left · 1 min 23 s elapsed"


def test_auto_outside_a_kernel_uses_text(monkeypatch):
    monkeypatch.delenv("BLOCKMEM_HEADLESS", raising=False)
    dash = LiveDashboard()
    assert dash.mode == "text" and "kernel" in dash.fallback_reason


def widget_dashboard(**kwargs):
    try:
        return LiveDashboard(mode="widget", **kwargs)
    except RuntimeError as exc:
        pytest.skip(f"widgets cannot be built in this process: {exc}")


def shown(view):
    """The figure a view shows (filled in place, drawn whole at each redraw)."""
    return view.live_figure


def test_widget_mode_shows_every_point_with_bounded_updates(capsys):
    clock = FakeClock()
    dash = widget_dashboard(total_steps=2000, title="dense", clock=clock, max_updates_per_s=4)
    assert dash.mode == "widget" and type(dash.live_figure) is go.Figure
    run_steps(dash, clock, 2000)                             # 2 s of fake time, 4 evals
    dash.on_end(None, history_dict())
    train, val, speed, memory, peak = shown(dash).data
    assert tuple(train.x) == tuple(range(1, 2001)) == tuple(speed.x) == tuple(memory.x)
    assert train.y[-1] == pytest.approx(5.0 / 2000)
    assert tuple(val.x) == (500, 1000, 1500, 2000)
    # throttle: 1 + 2 s * 4/s time-driven redraws, plus one per eval and one at the end
    assert dash.n_updates <= 1 + math.ceil(2.0 * 4) + 4 + 1
    assert "done" in dash._status.value and "dense" in dash._status.value
    assert "381 MiB RSS" in dash._status.value
    assert tuple(shown(dash).layout.xaxis.range) == (0, 2000)
    assert speed.y[-1] == 1234.0 and memory.y[-1] == pytest.approx((400e6 + 2000) / 2**20)
    assert tuple(peak.y) == pytest.approx(((400e6 + 2000) / 2**20,) * 2)
    assert shown(dash).layout.yaxis3.title.text == "MiB (RSS)"
    assert "done: step 2000/2000" in shown(dash).layout.title.text
    assert capsys.readouterr().out == ""                     # nothing printed outside a kernel


def test_widget_mode_new_run_starts_over_and_figure_uses_history():
    clock = FakeClock()
    dash = widget_dashboard(clock=clock)
    run_steps(dash, clock, 20, total=20, eval_every=10)
    dash.on_end(None, history_dict(interrupted=True))
    fig = dash.figure()
    assert "interrupted" in fig.layout.title.text and len(fig.data) == 5
    run_steps(dash, clock, 5, total=5, eval_every=5)         # the same dashboard, a new run
    dash.on_end(None, history_dict(5))
    assert tuple(shown(dash).data[0].x) == (1, 2, 3, 4, 5)
    assert tuple(shown(dash).data[1].x) == (5,)


def test_figure_before_the_end_uses_the_points_received(headless):
    clock = FakeClock()
    dash = LiveDashboard(clock=clock, print_every_s=100)
    run_steps(dash, clock, 12, total=50, eval_every=6)
    fig = dash.figure()
    assert tuple(fig.data[0].x) == tuple(range(1, 13)) and tuple(fig.data[1].x) == (6, 12)
    assert "12/50 steps" in fig.layout.title.text


def test_live_dashboard_takes_total_steps_from_a_config(headless, tiny_cfg):
    assert live_dashboard(tiny_cfg).total_steps == tiny_cfg.train.steps
    assert live_dashboard(tiny_cfg.train, total_steps=7).total_steps == 7


# ----------------------------------------------------------------------------- generic charts

from blockmem_lite.viz import widgets  # noqa: E402
from blockmem_lite.viz.live_base import Throttle  # noqa: E402
from blockmem_lite.viz.monitor import LiveMonitor  # noqa: E402


def test_line_chart_colours_dashes_references_and_log_ticks():
    fig = viz.line_chart(
        {"MoC": {"old": ([0, 1, 2], [0.9, 0.5, 0.2]), "new": ([0, 1, 2], [0.0, 0.4, 0.8])},
         "dense": ([1, 10, 100], torch.tensor([1.0, 2.0, 3.0]))},
        hlines={"chance": 0.1}, spans={"trained": (0, 50)}, vlines={"α": 5},
        log_x=True, y_tickformat=".0%", dashed=("dense",))
    assert [d.name for d in fig.data] == ["MoC: old", "MoC: new", "dense"]
    assert fig.data[0].line.color == fig.data[1].line.color != fig.data[2].line.color
    assert (fig.data[0].line.dash, fig.data[1].line.dash, fig.data[2].line.dash) == (
        "solid", "dash", "dash")
    assert tuple(fig.data[2].y) == (1.0, 2.0, 3.0)
    kinds = sorted(s.type for s in fig.layout.shapes)
    assert kinds == ["line", "line", "rect"]
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.tickformat == ".0%"
    assert 100 in fig.layout.xaxis.tickvals and "100" in fig.layout.xaxis.ticktext


def test_line_chart_rejects_mismatched_lengths_and_empty_series():
    with pytest.raises(ValueError, match=r"series\['a'\].*x has 3 values and y 2"):
        viz.line_chart({"a": ([1, 2, 3], [1, 2])})
    with pytest.raises(ValueError, match="series=dict"):
        viz.line_chart({})
    with pytest.raises(ValueError, match="x, y"):
        viz.line_chart({"a": [1, 2, 3]})


def test_line_panels_keep_a_name_coloured_alike_and_in_the_legend_once():
    panels = {"A": {"layer 0": ([1, 2], [1, 2]), "layer 1": ([1, 2], [2, 3])},
              "B": {"layer 1": ([1, 2], [5, 6]), "layer 0": ([1, 2], [7, 8])}}
    fig = viz.line_panels(panels, x_title=["step", "rank"], hlines={"B": {"uniform": 0.5}})
    assert len(fig.data) == 4
    by_name = {}
    for d in fig.data:
        by_name.setdefault(d.name, []).append(d)
    assert all(len({d.line.color for d in ds}) == 1 for ds in by_name.values())
    assert by_name["layer 0"][0].line.color != by_name["layer 1"][0].line.color
    assert [d.showlegend for d in fig.data] == [True, True, False, False]
    assert fig.data[2].xaxis == "x2"
    assert fig.layout.xaxis.title.text == "step" and fig.layout.xaxis2.title.text == "rank"
    assert len(fig.layout.shapes) == 1 and fig.layout.shapes[0].xref == "x2 domain"
    with pytest.raises(ValueError, match="x_title has 3 entries"):
        viz.line_panels(panels, x_title=["a", "b", "c"])


def test_grouped_bars_and_scatter_points():
    fig = viz.grouped_bars({"before": {"dense": 0.9, "MoC": 0.8},
                                "after": {"dense": 0.2, "MoC": 0.7}},
                               text_format=".0%", hlines={"floor": 0.05}, log_y=True)
    assert [d.type for d in fig.data] == ["bar", "bar"] and fig.layout.barmode == "group"
    assert tuple(fig.data[1].x) == ("dense", "MoC") and tuple(fig.data[1].y) == (0.2, 0.7)
    assert fig.data[0].marker.color != fig.data[1].marker.color
    assert fig.data[0].texttemplate == "%{y:.0%}" and fig.layout.yaxis.type == "log"
    with pytest.raises(ValueError, match=r"groups\['x'\]"):
        viz.grouped_bars({"x": {}})
    pts = viz.scatter_points({"dense": (1000.0, 1.5), "bcmt": (3000.0, 1.7)})
    assert [d.name for d in pts.data] == ["dense", "bcmt"]
    assert tuple(pts.data[1].x) == (3000.0,) and tuple(pts.data[1].text) == ("bcmt",)


def test_heatmap_labels_orientation_and_scale():
    fig = viz.heatmap(torch.eye(3)[:2], x=["a", "b", "c"], y=[10, 20], colorscale="Greens",
                          zmin=0)
    hm = fig.data[0]
    assert np.asarray(hm.z).shape == (2, 3) and tuple(hm.y) == ("10", "20")
    assert hm.colorscale[0][1] != hm.colorscale[-1][1]      # a real scale, resolved by plotly
    assert fig.layout.yaxis.autorange == "reversed" and hm.zmin == 0
    with pytest.raises(ValueError, match="x has 2 labels"):
        viz.heatmap(torch.eye(3), x=["a", "b"])
    with pytest.raises(ValueError, match="z with shape"):
        viz.heatmap(torch.ones(3))


# ----------------------------------------------------------------------------- mechanism figures


def decay(n, alpha):
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    w = np.where(j <= i, alpha ** np.clip(i - j, 0, None), 0.0)
    return w / w.sum(-1, keepdims=True)


def test_decay_heatmap_one_titled_panel_per_alpha_on_one_log_scale_and_lines():
    fig = viz.decay_heatmap({0.5: decay(6, 0.5), 0.9: decay(6, 0.9)})
    heat = [d for d in fig.data if d.type == "heatmap"]
    lines = [d for d in fig.data if d.type == "scatter"]
    assert len(heat) == 2 and len(lines) == 2 and heat[1].xaxis == "x2"
    assert [a.text for a in fig.layout.annotations][:2] == ["α = 0.5", "α = 0.9"]
    assert all(d.coloraxis == "coloraxis" for d in heat)
    ca = fig.layout.coloraxis
    assert ca.cmin == pytest.approx(-3) and ca.cmax == 0         # log10 weight, 0.001 .. 1
    assert list(ca.colorbar.ticktext) == ["1", "0.1", "0.01", "0.001"]
    assert "α = 0.9" in heat[1].hovertemplate
    np.testing.assert_allclose(np.asarray(heat[0].customdata), decay(6, 0.5))
    z = np.asarray(heat[0].z, dtype=float)
    assert np.isnan(z[0, 5])                                     # the future is blank
    np.testing.assert_allclose(z[5, :6], np.log10(np.clip(decay(6, 0.5)[5], 1e-3, None)))
    assert tuple(lines[1].y) == pytest.approx(tuple(decay(6, 0.9)[5, ::-1]))   # d = 0, 1, ...
    assert [d.name for d in lines] == ["α = 0.5", "α = 0.9"]
    assert lines[0].line.color != lines[1].line.color and fig.layout.yaxis3.type == "log"
    assert len(viz.decay_heatmap(decay(4, 0.8)).data) == 2
    with pytest.raises(ValueError, match=r"weights\[0.5\] with shape \(3, 4\)"):
        viz.decay_heatmap({0.5: np.ones((3, 4))})


def test_decay_heatmap_tells_alpha_08_from_10():
    fig = viz.decay_heatmap({0.8: decay(16, 0.8), 1.0: decay(16, 1.0)})
    r08, r10 = (np.asarray(d.y, dtype=float) for d in fig.data if d.type == "scatter")
    assert np.ptp(np.log10(r10)) == pytest.approx(0.0)          # flat: a plain mean
    assert np.ptp(np.log10(r08)) > 1.0                           # more than a decade apart
    z08, z10 = (np.asarray(d.z, dtype=float)[15] for d in fig.data if d.type == "heatmap")
    assert np.nanmax(np.abs(z08 - z10)) > 0.5                    # half a decade of colour


def test_summary_weights_heatmap_writes_the_characters():
    pi = torch.softmax(torch.randn(3, 4), -1)               # (N, L)
    chars = [list("ab c"), list("defg"), list("h\nij")]
    fig = viz.summary_weights_heatmap(pi, chars=chars)
    hm = fig.data[0]
    assert np.asarray(hm.z).shape == (3, 4) and hm.texttemplate == "%{text}"
    assert hm.text[0][2] == "␣" and hm.text[2][1] == "⏎"
    assert "0.250" in fig.layout.title.text                  # uniform 1/L
    with pytest.raises(ValueError, match="chars"):
        viz.summary_weights_heatmap(pi, chars=[list("ab")])


def test_gate_histogram_one_overlaid_histogram_per_layer():
    fig = viz.gate_histogram({"layer 0": torch.rand(10, 4), "layer 1": torch.rand(20)},
                                 bins=20)
    assert [d.type for d in fig.data] == ["histogram", "histogram"]
    assert len(fig.data[0].x) == 40 and fig.data[0].nbinsx == 20
    assert fig.layout.barmode == "overlay"
    with pytest.raises(ValueError, match="bins=0"):
        viz.gate_histogram({"a": [0.5]}, bins=0)


def test_memory_matrices_share_a_symmetric_diverging_scale():
    a1, a2 = torch.zeros(1, 4, 3), torch.zeros(4, 3)
    a1[0, 0, 0], a2[1, 2] = 2.0, -0.5
    fig = viz.memory_matrices({"before": a1, "after": a2}, row_labels=list("wxyz"))
    assert len(fig.data) == 2 and np.asarray(fig.data[0].z).shape == (4, 3)
    assert all(d.coloraxis == "coloraxis" for d in fig.data) and tuple(fig.data[0].y) == tuple("wxyz")
    ca = fig.layout.coloraxis
    assert (ca.cmin, ca.cmid, ca.cmax) == (-2.0, 0.0, 2.0)
    assert ca.colorscale[0][1] != ca.colorscale[-1][1]
    with pytest.raises(ValueError, match="row_labels has 2"):
        viz.memory_matrices({"a": a2}, row_labels=["p", "q"])


def test_routing_figures():
    heat, share = torch.rand(5, 4), torch.tensor([0.4, 0.3, 0.2, 0.1])
    fig = viz.routing_heatmap(heat, share, title="lb")
    assert [d.type for d in fig.data] == ["heatmap", "bar"]
    assert tuple(fig.data[1].x) == (1, 2, 3, 4) and fig.layout.shapes[0].y0 == 0.25
    with pytest.raises(ValueError, match="share with shape"):
        viz.routing_heatmap(heat, share[:3])
    ids = torch.tensor([[[0, 2, 3], [0, 1, 2]]])            # (B=1, W=2, k+1=3)
    w = torch.tensor([[[0.3, 0.5, 0.2], [0.3, 0.4, 0.3]]])
    dec = viz.routing_decisions(ids, w, n_chapters=5)
    z = np.asarray(dec.data[0].z)
    assert z.shape == (2, 5) and z[0, 3] == pytest.approx(0.2) and z[0, 1] == 0
    assert tuple(dec.data[0].y) == ("seq 0 · win 0", "seq 0 · win 1")
    with pytest.raises(ValueError, match="n_chapters=3"):
        viz.routing_decisions(ids, w, n_chapters=3)
    bar = viz.chapter_weights_bar([0, 4, 2], [0.29, 0.5, 0.21])
    assert tuple(bar.data[0].x) == ("ch 0", "ch 4", "ch 2")
    colours = bar.data[0].marker.color
    assert colours[0] != colours[1] == colours[2]
    with pytest.raises(ValueError, match="n_shared=4"):
        viz.chapter_weights_bar([0, 1], [0.5, 0.5], n_shared=4)


# ----------------------------------------------------------------------------- live monitor


class FakeTrainer:
    model = "the model"


def monitor_run(monitor, clock, total, dt):
    for step in range(1, total + 1):
        clock.now += dt
        monitor.on_step(FakeTrainer(), {"step": step, "total_steps": total})
    monitor.on_end(FakeTrainer(), {})


def bars(data):
    return viz.bar_compare({"a": data["a"], "b": data["b"]})


def test_throttle_first_call_due_then_waits():
    clock = FakeClock()
    t = Throttle(0.5, clock)
    assert t.take() and not t.take()
    clock.now = 0.49
    assert not t.due()
    clock.now = 0.5
    assert t.due() and t.take()


def test_monitor_probes_every_n_steps_and_prints_throttled_text(headless, capsys):
    clock, seen = FakeClock(), []

    def probe(trainer, rec):
        seen.append((trainer.model, rec["step"]))
        return {"a": rec["step"], "b": 2.0}

    mon = LiveMonitor(probe, bars, text=lambda d: f"a={d['a']}", every=10, title="probe",
                      clock=clock, print_every_s=1.0)
    assert mon.mode == "text"
    monitor_run(mon, clock, total=95, dt=0.05)               # 4.75 s of fake time
    assert mon.steps == [1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95]
    assert seen[0] == ("the model", 1) and mon.data[-1] == {"a": 95, "b": 2.0}
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "[probe] step 1/95: a=1"
    assert lines[-1] == "[probe] step 95/95: a=95"          # the last step is always printed
    assert 3 <= len(lines) <= 7 < len(mon.steps)             # ~1 line/s, not one per probe
    assert mon.n_printed == len(lines)
    fig = mon.figure()
    assert tuple(fig.data[0].y) == (95, 2.0) and fig.layout.title.text == "probe: step 95/95"


def test_monitor_record_adds_a_step_zero_and_a_new_run_starts_over(headless, capsys):
    mon = LiveMonitor(lambda t, r: {"a": r["step"], "b": 0}, bars, every=5, clock=FakeClock(),
                      print_every_s=0)
    mon.record(0, {"a": -1, "b": 0})
    monitor_run(mon, FakeClock(), total=10, dt=1)
    assert mon.steps == [0, 1, 5, 10]
    assert "step 0: a -1, b 0" in capsys.readouterr().out   # the default text line
    mon.on_step(FakeTrainer(), {"step": 1, "total_steps": 3})
    assert mon.steps == [1]
    with pytest.raises(ValueError, match="every=0"):
        LiveMonitor(lambda t, r: 0, bars, every=0)
    with pytest.raises(ValueError, match="figure="):
        LiveMonitor(lambda t, r: 0, "not a function")
    with pytest.raises(ValueError, match="before the first snapshot"):
        LiveMonitor(lambda t, r: 0, bars, mode="text").figure()


def test_monitor_falls_back_to_text_without_ipywidgets(monkeypatch, capsys):
    without_ipywidgets(monkeypatch)
    mon = LiveMonitor(lambda t, r: {"a": 1, "b": 2}, bars, title="m")
    assert mon.mode == "text" and "ipywidgets" in mon.fallback_reason
    mon.on_step(FakeTrainer(), {"step": 1, "total_steps": 5})
    out = capsys.readouterr().out
    assert "live monitor: widgets unavailable" in out and "[m] step 1/5: a 1, b 2" in out


def test_monitor_widget_mode_redraws_at_most_4_per_second():
    clock = FakeClock()
    try:
        mon = LiveMonitor(lambda t, r: {"a": r["step"], "b": 1.0}, bars, every=1, title="w",
                          mode="widget", clock=clock)
    except RuntimeError as exc:
        pytest.skip(f"widgets cannot be built in this process: {exc}")
    monitor_run(mon, clock, total=200, dt=0.01)              # 2 s, 200 probes
    assert len(mon.steps) == 200
    assert mon.n_updates <= 1 + math.ceil(2.0 * 4) + 1
    assert tuple(mon.live_figure.data[0].y) == (200, 1.0)    # the last one is drawn
    assert mon.live_figure.layout.title.text == "w: step 200/200"


def test_monitor_draws_figures_of_any_layout_one_after_another():
    """A figure of subplots after a plain one (and back): each is drawn as it is (a live
    FigureWidget refused such layout edits and stayed blank)."""
    clock = FakeClock()
    mon = LiveMonitor(lambda t, r: r["step"], every=1, mode="widget", clock=clock,
                      figure=lambda s: (viz.routing_heatmap(np.ones((4, 3)) * s, np.ones(3) / 3)
                                        if s % 2 else bars({"a": s, "b": 1})))
    for step in (1, 2, 3):
        clock.now += 1.0
        mon.on_step(FakeTrainer(), {"step": step, "total_steps": 3})
        fig = mon.live_figure
        assert ("xaxis2" in fig.layout) == bool(step % 2), step
    assert mon.n_updates == 3


# ----------------------------------------------------------------------------- sliders


def test_slider_figure_headless_builds_once_at_the_defaults(headless, capsys):
    calls = []

    def build(alpha, n):
        calls.append((alpha, n))
        return viz.decay_heatmap(decay(n, alpha))

    view = widgets.slider_figure(build, title="decay", alpha=widgets.slider(0.8, 0.0, 1.0, 0.05),
                                 n=(16, 2, 64))
    assert view.mode == "text" and view.widget is None and calls == [(0.8, 16)]
    assert isinstance(view.result, go.Figure)
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["decay: shown at alpha=0.8, n=16; the sliders need a Jupyter front end"]


def test_slider_specs_are_validated():
    assert widgets.slider(3, 1, 9).is_int and not widgets.slider(0.5, 0, 1).is_int
    assert widgets.choice([4, 8, 16], value=8).value == 8
    with pytest.raises(ValueError, match="value=2 is not allowed"):
        widgets.slider(2, 3, 9)
    with pytest.raises(ValueError, match="value=5 is not allowed"):
        widgets.choice([4, 8], value=5)
    with pytest.raises(ValueError, match="at least one slider"):
        widgets.slider_figure(lambda: None)
    with pytest.raises(ValueError, match="alpha='x'"):
        widgets.slider_figure(lambda alpha: None, mode="text", alpha="x")


def test_slider_widget_mode_labels_are_not_cut_and_moving_rebuilds():
    calls = []
    try:
        view = widgets.slider_figure(lambda chunk_size, beta: calls.append((chunk_size, beta)),
                                     mode="widget", chunk_size=widgets.choice([4, 8, 16], 8,
                                                                              label="chunk size C"),
                                     beta=(0.5, 0.0, 1.0, 0.05))
    except RuntimeError as exc:
        pytest.skip(f"widgets cannot be built in this process: {exc}")
    sel, beta = view.controls["chunk_size"], view.controls["beta"]
    assert type(sel).__name__ == "SelectionSlider" and type(beta).__name__ == "FloatSlider"
    assert view.widget.children[0].children == (view.labels["chunk_size"], sel)
    label = view.labels["chunk_size"].value                  # its own widget, never cut
    assert ">chunk size C</div>" in label and "white-space: nowrap" in label
    assert "min-width: 7.7em" in label                       # as wide as the longest label
    assert sel.description == "" and ">beta</div>" in view.labels["beta"].value
    assert calls == [(8, 0.5)]                               # run once at the defaults
    sel.value = 16
    assert calls[-1] == (16, 0.5) and view.values == {"chunk_size": 16, "beta": 0.5}


def test_monitor_series_mode_draws_every_snapshot_so_far(headless, capsys):
    mon = LiveMonitor(lambda t, r: {"a": r["step"] * 10}, series=True, every=2, print_every_s=0,
                      figure=lambda snaps: viz.line_chart(
                          {"a": ([s for s, _ in snaps], [d["a"] for _, d in snaps])}),
                      text=lambda snaps: f"{len(snaps)} points", clock=FakeClock())
    monitor_run(mon, FakeClock(), total=4, dt=1)
    assert tuple(mon.figure().data[0].x) == (1, 2, 4) and tuple(mon.figure().data[0].y) == (10, 20, 40)
    assert capsys.readouterr().out.strip().splitlines()[-1] == "step 4/4: 3 points"


# ----------------------------------------------------------------------------- notebook rule

INLINE_PLOTTING = ("go.Figure", "go.Heatmap", "go.Scatter", "go.Bar", "go.Histogram",
                   "make_subplots", "FigureWidget", "widgets.interactive")


def test_main_notebooks_plot_through_the_library_and_keep_cells_short():
    import json
    from pathlib import Path

    paths = sorted((Path(__file__).parent.parent / "notebooks").glob("0[0-9]_*.ipynb"))
    assert paths, "no main notebooks found"
    problems = []
    for path in paths:
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] != "code":
                continue
            src = "".join(cell["source"])
            if len(src.splitlines()) > 40:
                problems.append(f"{path.name} cell {i}: {len(src.splitlines())} lines > 40")
            problems += [f"{path.name} cell {i}: inline {name}" for name in INLINE_PLOTTING
                         if name in src]
    assert problems == []


# ----------------------------------------------------------------------------- lab figures

from blockmem_lite.lab import figures as lab_figures  # noqa: E402


def _bench(arch, variant, phase, ratio):
    return {"arch": arch, "variant": variant, "phase": phase, "seq_len": 64,
            "ratio_vs_dense": ratio, "flop_ceiling": 1.0}


def _lab_results(bench=True, recall=True):
    """A small lab result: dense, a fast-but-worse model, a slow-and-worse (dominated) one."""
    done = {"lm/dense": {"arch": "dense", "val_loss": {"": 3.0}},
            "lm/fast": {"arch": "fast", "val_loss": {"": 3.2}},
            "lm/cat": {"arch": "cat", "val_loss": {"C=4": 3.5, "C=8": 2.9}}}
    if bench:
        records = [_bench("dense", "", "train", None), _bench("fast", "", "train", 2.0),
                   _bench("cat", "C=4", "train", 0.5), _bench("cat", "C=8", "train", 0.4)]
        state = {"dense": {"t": [64, 256], "measured": [100, 400], "analytic": [100, 400]},
                 "fast": {"t": [64, 256], "measured": [50, 50], "analytic": [None, None]}}
        done["bench/*"] = {"records": records, "state": state}
    if recall:
        rows = [{"distance": d, "accuracy": a, "n_answers": 100} for d, a in ((4, 0.9), (20, 0.1))]
        by_pairs = [{"n_pairs": p, "accuracy": a} for p, a in ((1, 1.0), (2, 0.5))]
        blind = [{"distance": d, "accuracy": 0.02, "n_answers": 100} for d in (4, 20)]
        done["recall/fast"] = {"arch": "fast", "curves": {"": {"passkey": rows, "mqar": rows}},
                               "capacity": {"": by_pairs},
                               "slot_model": {"": [dict(p, slots=1) for p in by_pairs]},
                               "twin": {"curves": {"": {"passkey": blind, "mqar": blind}},
                                        "capacity": {"": by_pairs[:1]}},
                               "local_span": {"": 8}, "chance": {"passkey": 0.01, "mqar": 0.02}}
    return {"meta": {}, "done": done}


def test_pareto_front_drops_dominated_points_and_ties():
    points = {"a": (1.0, 3.0), "b": (2.0, 3.2), "c": (0.5, 3.5), "d": (1.0, 3.1), "e": (2.0, 3.2)}
    assert lab_figures.pareto_front(points) == ["b", "e", "a"]   # c, d dominated by a
    assert lab_figures.pareto_front({"x": (1.0, 1.0)}) == ["x"]


def test_pareto_points_and_figure_name_each_model_and_draw_the_front():
    results = _lab_results()
    points = lab_figures.pareto_points(results)
    assert points == {"dense": (1.0, 3.0), "fast": (2.0, 3.2), "cat C=4": (0.5, 3.5),
                      "cat C=8": (0.4, 2.9)}
    fig = lab_figures.pareto(results)
    front = [t for t in fig.data if t.name == "Pareto front"][0]
    assert list(front.x) == [2.0, 1.0, 0.4] and list(front.y) == [3.2, 3.0, 2.9]
    assert all("%{text}" in t.hovertemplate for t in fig.data if t.name != "Pareto front")
    assert set(lab_figures.pareto_points(results, labels=["cat"])) == {"cat C=4", "cat C=8"}


def test_state_vs_length_draws_the_analytic_model_dotted():
    fig = lab_figures.state_vs_length(_lab_results())
    dashes = {t.name: t.line.dash for t in fig.data}
    assert dashes == {"dense: measured": "solid", "dense: analytic": "dot",
                      "fast: measured": "solid"}


def test_lab_figures_skip_what_a_partial_result_lacks():
    partial = _lab_results(bench=False, recall=False)
    for fig in (lab_figures.pareto(partial), lab_figures.state_vs_length(partial),
                lab_figures.recall_vs_distance(partial, task="mqar"),
                lab_figures.recall_capacity(partial), lab_figures.facts_capacity(partial)):
        note = fig.layout.annotations[0].text
        assert len(fig.data) == 0 and ("not measured" in note or "no model" in note)
    fig = lab_figures.recall_vs_distance(_lab_results(), task="mqar")
    assert [t.name for t in fig.data] == ["fast", "fast twin"]
    assert list(fig.data[1].y) == [0.02, 0.02]


def test_lab_figures_and_report_of_a_partial_run_say_it_is_partial():
    from blockmem_lite.lab.report import report_markdown

    done = _lab_results()
    done["meta"] = {"plan": [*done["done"], "recall/cat", "bench/*x"]}
    assert lab_figures.partial_note(done) == ("partial run: 5 of 7 tasks stored (missing: "
                                              "recall/cat, bench/*x)")
    for fig in (lab_figures.pareto(done), lab_figures.recall_vs_distance(done),
                lab_figures.training_curves(done)):
        assert "partial run: 5 of 7 tasks stored" in fig.layout.title.text
    done["meta"]["plan"] = list(done["done"])
    assert lab_figures.partial_note(done) == ""
    assert "partial" not in lab_figures.pareto(done).layout.title.text
    meta = {"preset": "fast", "machine": "m", "device": "cpu", "torch": "2", "corpus": "c",
            "corpus_source": "s", "sizes": {"steps": 1}, "seed": 0, "plan": ["lm/dense", "x"]}
    report = report_markdown({"meta": meta, "done": {}})
    assert "**Partial run: 0 of 2 tasks stored** (missing: lm/dense, x)" in report


def test_recall_capacity_draws_accuracy_by_pairs_with_the_twin_and_the_slot_model():
    results = _lab_results()
    results["done"]["recall/fast"]["slot_model"][""][1]["accuracy"] = 0.25
    fig = lab_figures.recall_capacity(results)
    lines = {t.name: (list(t.x), list(t.y), t.line.dash, t.line.color) for t in fig.data}
    assert lines["fast: measured"][:3] == ([1, 2], [1.0, 0.5], "solid")
    assert lines["fast: twin"][2] == "dash" and lines["fast: twin"][1] == [1.0]
    assert lines["fast: slot model"][1:3] == ([1.0, 0.25], "dot")
    assert len({line[3] for line in lines.values()}) == 1         # one colour per model


def test_claims_overview_counts_verdicts_per_mechanism():
    rows = [{"arch": "bcmt", "verdict": "reproduced"}, {"arch": "bcmt", "verdict": "not reproduced"},
            {"arch": "cat", "verdict": "not reproduced"}]
    fig = lab_figures.claims_overview(rows)
    counts = {t.name: dict(zip(t.x, t.y, strict=True)) for t in fig.data}
    assert counts["not reproduced"] == {"bcmt": 1, "cat": 1}
    assert counts["reproduced"] == {"bcmt": 1, "cat": 0}
    assert len(lab_figures.claims_overview([]).data) == 0
