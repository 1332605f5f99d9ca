"""gpucheck: its logic on the CPU (--tiny), in-process and as a subprocess; a planted failure is
a FAIL row, exit 1, and the other checks still run; the CUDA-only pieces' logic on CPU."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from blockmem_lite import registry
from blockmem_lite.__main__ import COMMANDS
from blockmem_lite.measure import bench
from blockmem_lite.tools import gpucheck

ROOT = Path(__file__).resolve().parent.parent
BUILT_IN = {"armt", "bcmt", "cat", "dense", "honly", "moc"}
# Steps that say SKIP here: the CUDA RNG (no CUDA); FlexAttention before torch 2.5
SKIPPED_HERE = {"rng"} | (set() if importlib.util.find_spec("torch.nn.attention.flex_attention")
                          else {"flex"})


def _expected_checks(archs=None) -> set[tuple[str, str]]:
    """(step, arch) of every row a full --tiny run over ``archs`` (default: every registered
    one, which in this process may include mechanisms other tests registered) must hold."""
    archs = registry.names() if archs is None else archs
    rows = {(step, a) for step in ("autocast", "cached") for a in archs}
    rows |= {("train", a) for a in gpucheck.TRAIN_ARCHS}
    rows |= {(f"bench {phase} T={t}", a) for a in archs for phase in bench.PHASES
             for t in gpucheck.TINY.bench_lens}
    rows |= {("rng", "-")} | {("flex", name) for name in gpucheck.FLEX_MASKS}
    return rows


def _check_full_run(rows: list[dict], archs=None) -> None:
    assert {(r["step"], r["arch"]) for r in rows} == _expected_checks(archs)
    for r in rows:
        expected = "SKIP" if r["step"] in SKIPPED_HERE else "OK"
        assert r["result"] == expected, r
        assert r["figure"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpucheck") / "gpucheck.json"
    code = gpucheck.main(["--device", "cpu", "--tiny", "--out", str(out)])
    return code, json.loads(out.read_text())


def test_the_command_is_registered():
    assert COMMANDS["gpucheck"][:2] == ("blockmem_lite.tools.gpucheck", "main")


def test_tiny_in_process_has_every_arch_and_every_step_ok(tiny_run, capsys):
    code, result = tiny_run
    assert code == 0
    _check_full_run(result["rows"])
    assert result["device"] == "cpu" and result["tiny"] is True and result["total_s"] > 0
    bench_rows = [r for r in result["rows"] if r["step"].startswith("bench")]
    assert any("roofline" in r["figure"] for r in bench_rows)
    timed = [r for r in result["rows"] if r["seconds"] is not None]
    assert all(r["budget_s"] > 0 for r in timed)


def test_tiny_as_a_subprocess_prints_one_table_and_exits_0(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1",                 # like conftest: one thread
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    out = tmp_path / "gpucheck.json"
    done = subprocess.run([sys.executable, "-m", "blockmem_lite", "gpucheck", "--device", "cpu",
                           "--tiny", "--out", str(out)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    archs = {r["arch"] for r in rows if r["step"] == "autocast"}
    assert archs == BUILT_IN                      # a fresh process: the built-in mechanisms
    _check_full_run(rows, archs)
    lines = done.stdout.splitlines()
    assert lines[0].split()[:6] == ["step", "arch", "result", "figure", "seconds", "budget"]
    assert set(lines[1]) == {"-", " "}
    table = lines[2:2 + len(rows)]
    for line, row in zip(table, rows, strict=True):                    # one line per row
        assert line.startswith(row["step"]) and f" {row['arch']} " in line \
            and f" {row['result']} " in line, (line, row)
    skipped = sum(r["step"] in SKIPPED_HERE for r in rows)
    assert lines[2 + len(rows)].startswith(f"{len(rows) - skipped} OK, 0 FAIL, {skipped} SKIP")


def test_a_planted_failure_is_a_fail_row_and_the_rest_still_runs(monkeypatch, tmp_path, capsys):
    real = gpucheck.check_cached

    def broken(arch, device, sizes):
        if arch == "bcmt":
            raise RuntimeError("planted: the cache lost a block\nsecond line not shown")
        return real(arch, device, sizes)

    monkeypatch.setattr(gpucheck, "check_cached", broken)
    out = tmp_path / "gpucheck.json"
    code = gpucheck.main(["--device", "cpu", "--tiny", "--only", "autocast,cached,rng",
                          "--out", str(out)])
    assert code == 1
    rows = json.loads(out.read_text())["rows"]
    failed = [r for r in rows if r["result"] == "FAIL"]
    assert [(r["step"], r["arch"]) for r in failed] == [("cached", "bcmt")]
    assert failed[0]["figure"] == "RuntimeError: planted: the cache lost a block"
    assert failed[0]["seconds"] is not None
    others = [r for r in rows if r["result"] != "FAIL"]
    assert {(r["step"], r["arch"]) for r in others} == (
        {(s, a) for s in ("autocast", "cached") for a in registry.names()}
        - {("cached", "bcmt")}) | {("rng", "-")}
    assert all(r["result"] == "OK" for r in others if r["step"] != "rng")
    printed = capsys.readouterr().out
    assert "FAIL" in printed and "1 FAIL" in printed


def test_a_missed_criterion_is_a_fail_row_with_its_figure(monkeypatch):
    monkeypatch.setattr(gpucheck, "CACHED_TOLERANCE", 0.0)     # nothing can pass
    (row,) = gpucheck.run_checks(
        [c for c in gpucheck.plan(torch.device("cpu"), gpucheck.TINY, ("cached",))
         if c.arch == "bcmt"], torch.device("cpu"), progress=False)
    assert row.result == "FAIL" and row.figure.startswith("max |cached - full|")
    assert "exceeds" in row.figure


def test_without_cuda_the_default_device_is_a_clear_exit_2(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpucheck.main(["--tiny"]) == 2
    assert "no CUDA device here" in capsys.readouterr().err
    assert gpucheck.main(["--device", "cpu", "--only", "nope"]) == 2
    assert "--only='nope' is not allowed" in capsys.readouterr().err


def test_the_rng_round_trip_logic_on_the_cpu_rng():
    assert "cpu RNG restored" in gpucheck.rng_round_trip(torch.device("cpu"))


def test_the_flex_check_has_teeth(monkeypatch):
    """A wrong mask for FlexAttention (plain causal instead of CAT's) fails the agreement."""
    if not gpucheck.flex_available():
        pytest.skip("no FlexAttention in this torch")
    real = gpucheck._flex_case

    def wrong_mask(name, sizes, device, dtype):
        q, k, v, sdpa, mask = real(name, sizes, device, dtype)
        return q, k, v, sdpa, torch.ones_like(mask).tril()

    monkeypatch.setattr(gpucheck, "_flex_case", wrong_mask)
    with pytest.raises(gpucheck.CheckFailed, match="exceeds"):
        gpucheck.check_flex("cat", torch.device("cpu"), gpucheck.TINY)


def test_one_line_reasons():
    assert gpucheck.one_line(ValueError("a\nb")) == "ValueError: a"
    assert gpucheck.one_line(gpucheck.CheckFailed("the loss did not fall")) == \
        "the loss did not fall"
    assert len(gpucheck.one_line(RuntimeError("x" * 1000))) == 240
