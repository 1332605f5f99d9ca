"""Figure builders and the live dashboard (text mode, widget mode, fallback, throttling)."""

import math
import sys

import numpy as np
import pytest
import torch

from blockmem_lite.masks import block_causal_mask, causal_mask
from blockmem_lite.units import format_progress

go = pytest.importorskip("plotly.graph_objects")

from blockmem_lite.viz import figures, live  # noqa: E402
from blockmem_lite.viz.live import LiveDashboard, live_dashboard  # noqa: E402


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

    code = ("import sys, blockmem_lite, blockmem_lite.viz, blockmem_lite.viz.live; "
            "print(any(m in sys.modules for m in ('plotly', 'ipywidgets', 'IPython')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


# ----------------------------------------------------------------------------- masks


def test_mask_heatmap_keeps_orientation_queries_down_keys_across():
    mask = causal_mask(3, 5)                       # (Tq=3, Tk=5): last 3 queries of 5 keys
    fig = figures.mask_heatmap(mask, title="cache")
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
        figures.mask_heatmap(torch.ones(4, dtype=torch.bool))


def test_mask_grid_puts_masks_side_by_side():
    fig = figures.mask_grid({"dense": causal_mask(16), "block 4": block_causal_mask(16, 4)})
    assert len(fig.data) == 2
    assert fig.data[0].xaxis == "x" and fig.data[1].xaxis == "x2"
    np.testing.assert_array_equal(np.asarray(fig.data[1].z), block_causal_mask(16, 4).int())
    assert fig.layout.yaxis.autorange == "reversed" and fig.layout.yaxis2.autorange == "reversed"
    titles = [a.text for a in fig.layout.annotations]
    assert any("dense" in t for t in titles) and any("block 4" in t for t in titles)


# ----------------------------------------------------------------------------- attention


def test_attention_heatmap_one_subplot_per_head_with_token_labels():
    weights = torch.softmax(torch.randn(3, 4, 4), dim=-1)   # (H, Tq, Tk)
    fig = figures.attention_heatmap(weights, tokens=["a", " ", "\n", "b"])
    assert len(fig.data) == 3
    np.testing.assert_allclose(np.asarray(fig.data[2].z), weights[2].numpy(), rtol=1e-6)
    assert fig.layout.xaxis.ticktext == ("a", "␣", "⏎", "b")
    assert fig.layout.yaxis3.autorange == "reversed"


def test_attention_heatmap_limits_heads_and_accepts_batches():
    weights = torch.rand(2, 6, 3, 5)                         # (B, H, Tq, Tk)
    fig = figures.attention_heatmap(weights, max_heads=4, batch_index=1,
                                    tokens=list("abcde"))
    assert len(fig.data) == 4
    np.testing.assert_allclose(np.asarray(fig.data[0].z), weights[1, 0].numpy(), rtol=1e-6)
    assert "first 4 of 6 heads" in fig.layout.title.text
    assert fig.layout.yaxis.ticktext == ("c", "d", "e")      # queries: the last 3 keys
    single = figures.attention_heatmap(torch.rand(4, 4))
    assert len(single.data) == 1


def test_attention_heatmap_rejects_wrong_token_count():
    with pytest.raises(ValueError, match="tokens"):
        figures.attention_heatmap(torch.rand(4, 4), tokens=["a", "b"])


# ----------------------------------------------------------------------------- training


def test_loss_curves_train_line_and_val_markers_per_run():
    fig = figures.loss_curves({"dense": history_dict(), "bcmt": history_dict(6)})
    assert len(fig.data) == 4
    train, val = fig.data[0], fig.data[1]
    assert train.mode == "lines" and "markers" in val.mode
    assert train.line.color == val.line.color != fig.data[2].line.color
    assert tuple(val.x) == (5, 10) and tuple(val.y) == (2.7, 2.2)


def test_loss_curves_x_in_time_and_tokens():
    h = history_dict()
    by_time = figures.loss_curves({"r": h}, x="time")
    assert tuple(by_time.data[1].x) == (2.5, 5.0)           # val steps 5, 10 at 0.5 s/step
    by_tokens = figures.loss_curves({"r": h}, x="tokens", tokens_per_step=100)
    assert tuple(by_tokens.data[0].x)[:2] == (100, 200)
    with pytest.raises(ValueError, match="tokens_per_step"):
        figures.loss_curves({"r": h}, x="tokens")
    with pytest.raises(ValueError, match="x='epoch'"):
        figures.loss_curves({"r": h}, x="epoch")


def test_loss_curves_read_history_objects_by_attribute():
    class Hist:
        pass

    h = Hist()
    for key, value in history_dict().items():
        setattr(h, key, value)
    fig = figures.loss_curves({"obj": h})
    assert tuple(fig.data[0].y) == tuple(history_dict()["loss"])


def test_training_summary_has_loss_throughput_and_memory_panels():
    fig = figures.training_summary(history_dict(interrupted=True), title="run A")
    assert len(fig.data) == 4                                # train, val, tokens/s, memory
    assert (fig.data[0].name, fig.data[1].name) == ("train", "val")
    assert fig.data[0].line.color != fig.data[1].marker.color  # val stands out on the line
    assert tuple(fig.data[3].y) == (200.0,) * 10             # MiB
    assert fig.layout.yaxis3.title.text == "MiB (RSS)"
    assert "interrupted" in fig.layout.title.text and "run A" in fig.layout.title.text
    assert fig.data[3].yaxis == "y3" and fig.data[0].yaxis == "y"


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
    fig = figures.throughput_vs_length(bench_records())
    assert len(fig.data) == 4
    assert {d.name for d in fig.data} == {"dense · train", "dense · decode",
                                          "bcmt / L=64 · train", "bcmt / L=64 · decode"}
    assert tuple(fig.data[0].x) == (128, 256, 512)           # sorted by length
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    one_phase = figures.throughput_vs_length(bench_records(), phase="train")
    assert [d.name for d in one_phase.data] == ["dense", "bcmt / L=64"]


def test_memory_vs_length_names_the_method_and_converts_to_mib():
    fig = figures.memory_vs_length(bench_records(), phase="train")
    assert len(fig.data) == 2
    assert tuple(fig.data[0].y) == (128.0, 256.0, 512.0)
    assert fig.layout.yaxis.title.text == "peak memory (MiB, CUDA peak)"
    state = figures.memory_vs_length(bench_records(), key="state_bytes", phase="decode")
    assert tuple(state.data[1].y) == pytest.approx((0.25, 0.5, 1.0))
    with pytest.raises(ValueError, match="phase='prefill'"):
        figures.memory_vs_length(bench_records(), phase="prefill")
    with pytest.raises(ValueError, match="key="):
        figures.memory_vs_length(bench_records(), key="flops")


def test_memory_axis_titles_use_the_shared_method_labels():
    assert figures.memory_method_label("saved_tensors") == "saved for backward"
    assert figures.memory_method_label(None) == "unknown method"
    records = [{**r, "memory_method": None} for r in bench_records()]
    fig = figures.memory_vs_length(records, phase="train")
    assert fig.layout.yaxis.title.text == "peak memory (MiB, unknown method)"


def test_bar_compare_with_reference_line():
    fig = figures.bar_compare({"dense": 1.0, "bcmt": 1.7}, reference=1.0)
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
    monkeypatch.setattr(live, "_in_notebook_kernel", lambda: True)
    assert LiveDashboard().mode == "text"


def test_auto_falls_back_to_text_when_figurewidget_fails(monkeypatch, capsys):
    monkeypatch.delenv("BLOCKMEM_HEADLESS", raising=False)
    monkeypatch.setattr(live, "_in_notebook_kernel", lambda: True)

    def broken_figure_widget(*args, **kwargs):
        raise ImportError("anywidget is missing")

    monkeypatch.setattr(go, "FigureWidget", broken_figure_widget)
    dash = LiveDashboard(total_steps=10)
    assert dash.mode == "text" and dash.widget is None
    assert "anywidget is missing" in dash.fallback_reason
    dash.on_step(None, step_rec(1, total=10))
    out = capsys.readouterr().out
    assert "widgets unavailable" in out and out.count("\n") == 2
    with pytest.raises(RuntimeError, match="anywidget is missing"):
        LiveDashboard(mode="widget")


def test_auto_outside_a_kernel_uses_text(monkeypatch):
    monkeypatch.delenv("BLOCKMEM_HEADLESS", raising=False)
    dash = LiveDashboard()
    assert dash.mode == "text" and "kernel" in dash.fallback_reason


def widget_dashboard(**kwargs):
    try:
        return LiveDashboard(mode="widget", **kwargs)
    except RuntimeError as exc:
        pytest.skip(f"widgets cannot be built in this process: {exc}")


def test_widget_mode_shows_every_point_with_bounded_updates(capsys):
    clock = FakeClock()
    dash = widget_dashboard(total_steps=2000, title="dense", clock=clock, max_updates_per_s=4)
    assert dash.mode == "widget" and isinstance(dash._figure_widget, go.FigureWidget)
    run_steps(dash, clock, 2000)                             # 2 s of fake time, 4 evals
    dash.on_end(None, history_dict())
    train, val = dash._figure_widget.data
    assert tuple(train.x) == tuple(range(1, 2001))
    assert train.y[-1] == pytest.approx(5.0 / 2000)
    assert tuple(val.x) == (500, 1000, 1500, 2000)
    # throttle: 1 + 2 s * 4/s time-driven redraws, plus one per eval and one at the end
    assert dash.n_updates <= 1 + math.ceil(2.0 * 4) + 4 + 1
    assert "done" in dash._status.value and "dense" in dash._status.value
    assert "381 MiB RSS" in dash._status.value
    assert tuple(dash._figure_widget.layout.xaxis.range) == (0, 2000)
    assert capsys.readouterr().out == ""                     # nothing printed outside a kernel


def test_widget_mode_new_run_starts_over_and_figure_uses_history():
    clock = FakeClock()
    dash = widget_dashboard(clock=clock)
    run_steps(dash, clock, 20, total=20, eval_every=10)
    dash.on_end(None, history_dict(interrupted=True))
    fig = dash.figure()
    assert "interrupted" in fig.layout.title.text and len(fig.data) == 4
    run_steps(dash, clock, 5, total=5, eval_every=5)         # the same dashboard, a new run
    dash.on_end(None, history_dict(5))
    assert tuple(dash._figure_widget.data[0].x) == (1, 2, 3, 4, 5)
    assert tuple(dash._figure_widget.data[1].x) == (5,)


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
