"""A mechanism from outside the library: sliding-window attention, defined in this file only.

Importing the file registers it (as ``--plugin tests/test_plugin_mechanism.py`` does), and it
then goes through the same API and command line as the built-in mechanisms: config fields
and errors, the Trainer, ``bench`` (in process, through the CLI and in a fresh process),
``trace``, cached generation == the full forward, and ``check_causal``. No library file
names it.
"""

import fnmatch
import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import blockmem_lite
from blockmem_lite import (
    Mechanism,
    Options,
    Trainer,
    available_archs,
    build_model,
    preset,
    register_mechanism,
    registry,
    trace,
)
from blockmem_lite.checks import CheckFailed, check_causal
from blockmem_lite.measure.bench import run_bench
from blockmem_lite.measure.flops import dense_decode_layer_flops, layer_matmul_flops, lm_head_flops
from blockmem_lite.models.dense import DenseLM
from blockmem_lite.nn import Block
from blockmem_lite.registry import knob
from blockmem_lite.tools.bench_command import bench_main
from blockmem_lite.tools.train_command import train_main
from blockmem_lite.validation import check_int, fail

HERE = str(Path(__file__).resolve())
ROOT = Path(__file__).resolve().parent.parent


# --- the mechanism: everything a plugin declares ----------------------------------------------

def window_mask(q_len: int, kv_len: int, window: int, device=None, peek: int = 0):
    """(q_len, kv_len) bool: query i (the last q_len of kv_len positions) sees the ``window``
    newest keys up to itself; ``peek`` > 0 plants a look-ahead bug (for the checks' teeth)."""
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    k_pos = torch.arange(kv_len, device=device)[None, :]
    return (k_pos <= q_pos + peek) & (q_pos - k_pos < window)


@dataclass
class WindowOptions(Options):
    window: int = knob(16, help="W: keys each token attends to", symbol="W", sweep=(8,),
                       presets={"tiny": 8, "fast": 16}, boundary=True)

    def validate(self, cfg) -> None:
        check_int("window", self.window, 1)
        if self.window > cfg.seq_len:
            fail("window", self.window, f"must be between 1 and seq_len={cfg.seq_len}")


class WindowBlock(Block):
    """A pre-norm block whose attention sees only the last ``window`` positions (the window
    mask is the whole rule: it includes causality, so ``causal=False``)."""

    def __init__(self, cfg, peek: int = 0):
        super().__init__(cfg.d_model, cfg.n_head, cfg.mlp_ratio, cfg.rope_base, cfg.norm_eps)
        self.window, self.peek = cfg.window, peek

    def forward(self, x, positions=None, cache=None, reference=False):
        kv_len = x.shape[1] + (cache.length if cache is not None else 0)
        mask = window_mask(x.shape[1], kv_len, self.window, x.device, self.peek)
        return super().forward(x, positions, cache, reference, mask=mask, causal=False)


class SlidingWindowLM(DenseLM):
    """The dense stack with windowed attention (the KV cache keeps every key; only the
    attention is windowed, which keeps this example short)."""

    trace_keys = ("layer*.hidden", "layer*.attn_weights")
    peek = 0

    def build_block(self, index: int):
        return WindowBlock(self.cfg, self.peek)


def flops_per_token(cfg, seq_len: int, decode: bool = False) -> float:
    """Each query sees at most W keys: about min(W, T/2) on average in training.

    This is the algorithm's cost. The kernel here is dense attention under a mask, which
    computes every key and throws the far ones away, so torch's counter sees 4·d·T per
    query in training (the mask is not a causal flag, so no half is skipped) and 4·d·t per
    decoding step: the gap ``test_its_flop_model_gap_is_the_masked_keys`` checks term by term.
    """
    if decode:
        layer = dense_decode_layer_flops(cfg.d_model, min(cfg.window, seq_len))
    else:
        layer = layer_matmul_flops(cfg.d_model) + 4.0 * cfg.d_model * min(cfg.window, seq_len / 2)
    return cfg.n_layer * layer + lm_head_flops(cfg.d_model, cfg.vocab_size)


SWA = register_mechanism(Mechanism(
    name="swa", model=SlidingWindowLM, options=WindowOptions, flops=flops_per_token,
    summary="sliding-window attention (a test plugin)"))


@pytest.mark.parametrize("phase", ("train", "decode"))
@pytest.mark.parametrize("seq_len", (64, 128))
def test_its_flop_model_gap_is_the_masked_keys(phase, seq_len):
    from blockmem_lite.measure import flopcount
    cfg = preset("fast", arch="swa").model
    gap = flopcount.flop_model_gap(cfg, phase, seq_len)
    seen = min(cfg.window, seq_len) if phase == "decode" else min(cfg.window, seq_len / 2)
    masked = cfg.n_layer * 4.0 * cfg.d_model * (seq_len - seen)       # computed, then masked
    explained = gap.analytic + (masked if phase == "decode" else 3 * masked)
    assert gap.ratio > 1.1                                     # a real gap at these lengths
    assert gap.counted == pytest.approx(explained, rel=0.10)


def _model(**overrides):
    torch.manual_seed(0)
    return build_model(preset("tiny", arch="swa", **overrides)).double().eval()


def _tokens(t=24, batch=2, seed=0):
    return torch.randint(0, 256, (batch, t), generator=torch.Generator().manual_seed(seed))


# --- the API -----------------------------------------------------------------------------------

def test_it_is_registered_as_a_plugin_with_its_options_and_presets():
    assert "swa" in available_archs()
    assert registry.source("swa") == HERE              # a fresh process can load this file
    cfg = preset("tiny", arch="swa").model
    assert cfg.window == 8 and cfg.option_names == ("window",)
    assert preset("tiny", arch="swa", window=4).model.window == 4


@pytest.mark.parametrize("overrides, message", [
    (dict(window=0), r"window=0 is not allowed: expected an integer >= 1"),
    (dict(window=64), r"window=64 is not allowed: must be between 1 and seq_len=32"),
    (dict(block_size=8), r"block_size=8 is not allowed: an option of bcmt, honly, not of "
                         r"arch='swa'"),
])
def test_bad_options_are_clear_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        preset("tiny", arch="swa", **overrides)


def test_causal_and_the_check_has_teeth():
    model = _model()
    check_causal(model, _tokens(32))
    SlidingWindowLM.peek = 1                           # a window that sees one token ahead
    try:
        leaky = _model()
    finally:
        SlidingWindowLM.peek = 0
    with pytest.raises(CheckFailed, match="causality"):
        check_causal(leaky, _tokens(32))


def test_the_window_really_limits_what_a_token_sees():
    model, x = _model(), _tokens(32)
    changed = x.clone()
    changed[:, 0] = (x[:, 0] + 1) % 256                 # token 0 is outside the window of 20+
    with torch.no_grad():
        a, b = model(x).logits, model(changed).logits
    # two layers of window 8 reach back 14 tokens: from position 15 on nothing moves
    assert torch.allclose(a[:, 15:], b[:, 15:], atol=1e-12)
    assert (a[:, :8] - b[:, :8]).abs().max() > 1e-6


def test_cached_generation_equals_the_full_forward():
    model, x = _model(), _tokens(20)
    with torch.no_grad():
        full = model(x).logits
        logits, state = model.prefill(x[:, :5], max_len=20)
        steps = [logits]
        for i in range(5, 20):
            step_logits, state = model.step(x[:, i], state)
            steps.append(step_logits[:, None])
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-10)
    out = model.generate(x[:, :6], 6, greedy=True)
    with torch.no_grad():
        again = model(out[:, :-1]).logits.argmax(-1)
    assert torch.equal(out[:, 6:], again[:, 5:])


def test_trace_records_the_declared_keys():
    model = _model()
    with trace(model) as t:
        model(_tokens(16), reference=True)
    for pattern in SlidingWindowLM.trace_keys:
        assert fnmatch.filter(t.records, pattern), pattern
    weights = t["layer0.attn_weights"]                  # (B, H, T, T): nothing beyond W
    assert torch.all(weights[..., 15, :8] == 0) and weights[..., 15, 8:16].sum() > 0.99


def test_it_trains_with_the_trainer():
    torch.manual_seed(0)
    model = build_model(preset("tiny", arch="swa"))
    pattern = torch.arange(33).repeat(64, 1) % 7                      # a learnable sequence
    data = torch.utils.data.TensorDataset(pattern[:, :-1], pattern[:, 1:])
    cfg = preset("tiny", arch="swa", steps=30, lr=1e-2, device="cpu").train
    history = Trainer(model, cfg, data, callbacks=[]).fit()
    assert history.step[-1] == 30
    assert sum(history.loss[-5:]) / 5 < 0.5 * history.loss[0]


def test_it_benches_against_dense_with_a_ceiling():
    records = run_bench(["swa"], [32], d_model=32, n_layer=1, n_head=2, batch=1, threads=1,
                        warmup=1, repeats=1, decode_burst=2, memory=("none",),
                        options={"window": [8]}, progress=False)
    mine = [r for r in records if r["arch"] == "swa"]
    assert {(r["variant"], r["phase"]) for r in mine} == {("W=8", "train"), ("W=8", "decode")}
    assert all(r["ratio_vs_dense"] > 0 and r["flop_ceiling"] > 1 for r in mine)


def test_its_peak_rss_is_read_in_a_fresh_process_that_loads_the_plugin():
    (_, record) = run_bench(["swa"], [16], d_model=32, n_layer=1, n_head=2, batch=1, threads=1,
                            warmup=1, repeats=1, phases=("train",), memory=("rss",),
                            options={"window": 8}, progress=False)
    assert record["arch"] == "swa" and record["memory_method"] == "rss_subprocess"
    assert record["rss_peak_bytes"] > record["rss_base_bytes"] > 0


# --- the command line --------------------------------------------------------------------------

def test_bench_cli_takes_the_plugin_and_its_option(tmp_path, capsys):
    path = tmp_path / "swa.json"
    code = bench_main(["--plugin", HERE, "--arch", "swa", "--window", "4,8", "--seq-len", "16",
                       "--phases", "train", "--memory", "none", "--d-model", "32", "--n-layer",
                       "1", "--n-head", "2", "--batch", "1", "--threads", "1", "--warmup", "1",
                       "--repeats", "1", "--json", str(path)])
    assert code == 0
    assert [r["variant"] for r in json.loads(path.read_text())] == ["", "W=4", "W=8"]
    assert "swa" in capsys.readouterr().out


def test_train_cli_trains_and_resumes_the_plugin(tmp_path, capsys):
    out = tmp_path / "run"
    base = ["--plugin", HERE, "--preset", "tiny", "--arch", "swa", "--out", str(out)]
    assert train_main([*base, "--steps", "3", "--set", "window=4"]) == 0
    stored = torch.load(out / "checkpoint.pt", weights_only=True)
    assert stored["run_config"]["model"]["arch"] == "swa"
    assert stored["run_config"]["model"]["window"] == 4
    assert train_main([*base, "--steps", "5", "--set", "window=4", "--resume"]) == 0
    assert "resuming at step 3" in capsys.readouterr().out
    assert train_main([*base, "--steps", "5", "--set", "window=0", "--out",
                       str(tmp_path / "bad")]) == 2
    assert "window=0 is not allowed" in capsys.readouterr().err


def test_a_fresh_process_lists_the_plugin_in_help():
    done = subprocess.run([sys.executable, "-m", "blockmem_lite", "train", "--plugin", HERE,
                           "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "swa: sliding-window attention (a test plugin)" in done.stdout
    assert "window=16  W: keys each token attends to" in done.stdout
    done = subprocess.run([sys.executable, "-m", "blockmem_lite", "bench", "--plugin", HERE,
                           "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "--window TEXT" in done.stdout and "[swa]" in done.stdout


# --- plugin loading: files, entry points, errors ---------------------------------------------

def test_an_installed_entry_point_registers_its_mechanism(tmp_path, monkeypatch):
    (tmp_path / "swa_plugin_pkg.py").write_text(textwrap.dedent("""
        from blockmem_lite import Mechanism, register_mechanism
        from blockmem_lite.models.dense import DenseLM

        def install():
            register_mechanism(Mechanism(name="swa_ep", model=DenseLM, summary="from a package"))
    """))
    info = tmp_path / "swa_plugin_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: swa-plugin-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[blockmem_lite.mechanisms]\nswa_ep = swa_plugin_pkg:install\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    try:
        assert "swa_ep" in available_archs()
        assert registry.source("swa_ep") == "entry point swa_ep"
        assert registry.plugin_file("swa_ep") is None   # a fresh process finds it by itself
    finally:
        registry.unregister("swa_ep")


@pytest.mark.parametrize("source, message", [
    ("", "registered no mechanism"),
    ("raise RuntimeError('broken on purpose')", "failed to import: RuntimeError: broken"),
    ("from blockmem_lite import Mechanism, register_mechanism\n"
     "from blockmem_lite.models.dense import DenseLM\n"
     "register_mechanism(Mechanism(name='dense', model=DenseLM, summary='x'))",
     "name='dense' is not allowed: a built-in mechanism has that name"),
])
def test_bad_plugin_files_are_clear_errors(tmp_path, source, message):
    path = tmp_path / "plugin.py"
    path.write_text(source)
    with pytest.raises(ValueError, match=message):
        blockmem_lite.load_plugin(path)
    assert registry.source("dense") == registry.BUILTIN


def test_plugin_cli_errors_exit_2(tmp_path, capsys):
    assert bench_main(["--plugin", str(tmp_path / "missing.py")]) == 2
    err = capsys.readouterr().err
    assert "plugin=" in err and "expected an existing .py file" in err
    assert train_main(["--plugin", str(tmp_path / "missing.py")]) == 2


def test_a_session_only_mechanism_cannot_be_measured_in_a_fresh_process():
    class Local(DenseLM):
        pass

    Local.__module__ = "__main__"                        # as if defined in a notebook
    register_mechanism(Mechanism(name="session_only", model=Local, summary="defined here"))
    try:
        with pytest.raises(ValueError, match="defined in this session only"):
            run_bench(["session_only"], [16], memory=("rss",), progress=False)
        records = run_bench(["session_only"], [16], d_model=32, n_layer=1, n_head=2, batch=1,
                            warmup=1, repeats=1, phases=("train",), memory=("saved",),
                            progress=False)
        assert records[-1]["memory_method"] == "saved_tensors"
    finally:
        registry.unregister("session_only")


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="Bad Name"), "name='Bad Name' is not allowed"),
    (dict(model="not callable"), "model='not callable' is not allowed"),
    (dict(options=dict), "options=.*dataclass subclassing registry.Options"),
    (dict(options=dataclass(type("HugePreset", (Options,), {
        "__annotations__": {"w": int}, "w": knob(4, help="w", presets={"huge": 8})}))),
     "HugePreset.w presets=.*expected preset names among tiny"),
    (dict(options=dataclass(type("TwoSpans", (Options,), {
        "__annotations__": {"a": int, "b": int}, "a": knob(4, help="a", span=True),
        "b": knob(4, help="b", span=True)}))), "TwoSpans span knobs=.*at most one"),
])
def test_a_malformed_mechanism_is_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Mechanism(**{"name": "x", "model": DenseLM, "summary": "x", **kwargs})
