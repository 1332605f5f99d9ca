"""Every bad input to the config and the commands gets one clear line, before any work: the
name the user typed (the flag on a command line), the value and what is allowed; a refused
command leaves no empty output folder behind (issue 48, part B)."""

import errno
import time
from pathlib import Path

import pytest
import torch

from blockmem_lite import ModelConfig, TrainConfig
from blockmem_lite.measure import bench
from blockmem_lite.tools import gpucheck
from blockmem_lite.tools.bench_command import bench_main
from blockmem_lite.tools.reproduce_command import reproduce_main
from blockmem_lite.tools.train_command import train_main
from blockmem_lite.validation import check_device

TINY = ["--preset", "tiny", "--steps", "1"]
BENCH_TINY = ["--seq-len", "16", "--d-model", "32", "--n-layer", "1", "--n-head", "2",
              "--phases", "train", "--memory", "none", "--warmup", "0", "--repeats", "1"]
DEVICES = "expected 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"


def _one_clear_line(err: str) -> str:
    """The command's error line; no traceback came with it."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


# --- TrainConfig: lr and weight_decay --------------------------------------------------------

def test_an_absurd_lr_is_refused_naming_lr_and_its_range(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"lr=1e\+300 is not allowed: expected a number in "
                                         r"\(0.0, 1.0\]"):
        TrainConfig(lr=1e300)
    assert train_main([*TINY, "--set", "lr=1e300", "--out", str(tmp_path / "run")]) == 2
    assert "lr=1e+300 is not allowed" in _one_clear_line(capsys.readouterr().err)


def test_weight_decay_is_bounded_by_the_lr_and_named_itself(tmp_path, capsys):
    TrainConfig(lr=0.01, weight_decay=99.0)                 # lr * weight_decay = 0.99: allowed
    with pytest.raises(ValueError, match=r"weight_decay=100.0 is not allowed: expected "
                                         r"lr \* weight_decay < 1"):
        TrainConfig(lr=0.01, weight_decay=100.0)
    assert train_main([*TINY, "--set", "weight_decay=1e30", "--out", str(tmp_path / "r")]) == 2
    line = _one_clear_line(capsys.readouterr().err)
    assert "weight_decay=1e+30 is not allowed" in line and "Try a lower lr" not in line


# --- sizes too large for the machine: refused in Python numbers, before building --------------

def test_a_d_model_too_large_even_for_the_meta_device_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert train_main([*TINY, "--set", "d_model=1000000000", "--out", str(out)]) == 2
    line = _one_clear_line(capsys.readouterr().err)
    assert "too large for this machine" in line and "d_model" in line
    assert not out.exists()


def test_the_divisors_of_a_huge_d_model_are_listed_at_once():
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"n_head=2 is not allowed: must divide "
                                         r"d_model=1000000001 \(divisors: 1, 7, 11, 13, 19, 77,"):
        ModelConfig(d_model=1_000_000_001, n_head=2)
    assert time.perf_counter() - start < 5


def test_the_bench_refuses_sizes_too_large_before_building_a_model(capsys):
    assert bench_main(["--seq-len", "32", "--d-model", "100000", "--phases", "train",
                       "--memory", "none"]) == 2
    assert "too large for this machine" in _one_clear_line(capsys.readouterr().err)
    with pytest.raises(ValueError, match="too large for this machine"):
        bench.run_bench(["dense"], [32], d_model=100_000, memory=("none",), progress=False)


# --- devices -----------------------------------------------------------------------------------

@pytest.mark.parametrize("device, allowed", [("cuda:0", True), ("cuda:1", True), ("cuda:x", False),
                                             ("cuda:", False), ("tpu", False)])
def test_device_names_are_checked_by_one_rule(device, allowed):
    if allowed:
        check_device("device", device)
    else:
        with pytest.raises(ValueError, match=f"device='{device}' is not allowed: {DEVICES}"):
            check_device("device", device)


def test_the_bench_and_gpucheck_refuse_an_unknown_device_as_train_does(tmp_path, capsys):
    assert train_main([*TINY, "--device", "tpu", "--out", str(tmp_path / "run")]) == 2
    assert f"device='tpu' is not allowed: {DEVICES}" in _one_clear_line(capsys.readouterr().err)
    assert bench_main([*BENCH_TINY, "--device", "tpu"]) == 2
    assert f"--device='tpu' is not allowed: {DEVICES}" in _one_clear_line(
        capsys.readouterr().err)
    assert gpucheck.main(["--device", "tpu", "--tiny"]) == 2
    assert f"--device='tpu' is not allowed: {DEVICES}" in _one_clear_line(
        capsys.readouterr().err)


# --- output paths ------------------------------------------------------------------------------

def test_gpucheck_refuses_an_out_under_a_file_before_running_checks(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    target = tmp_path / "afile" / "x.json"
    assert gpucheck.main(["--device", "cpu", "--tiny", "--only", "rng", "--out",
                          str(target)]) == 2
    captured = capsys.readouterr()
    assert "--out" in _one_clear_line(captured.err) and "is a file" in captured.err
    assert "rng" not in captured.out                          # refused before any check ran


def test_gpucheck_says_in_one_line_when_its_out_cannot_be_written(tmp_path, capsys,
                                                                  monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    assert gpucheck.main(["--device", "cpu", "--tiny", "--only", "rng", "--out",
                          str(tmp_path / "x.json")]) == 2
    captured = capsys.readouterr()
    assert "No space left on device" in _one_clear_line(captured.err) and "rng" in captured.out


@pytest.mark.parametrize("command", ["train", "reproduce", "gpucheck", "bench"])
def test_an_empty_output_path_is_refused(tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    main, argv = {"train": (train_main, [*TINY, "--out", ""]),
                  "reproduce": (reproduce_main, ["--preset", "tiny", "--steps", "0",
                                                 "--out", ""]),
                  "gpucheck": (gpucheck.main, ["--device", "cpu", "--tiny", "--only", "rng",
                                               "--out", ""]),
                  "bench": (bench_main, [*BENCH_TINY, "--json", ""])}[command]
    assert main(argv) == 2
    flag = "--json" if command == "bench" else "--out"
    assert f"{flag}='' is not allowed" in _one_clear_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []                     # nothing trained or written


# --- the flag the user typed -------------------------------------------------------------------

def test_a_bad_corpus_names_the_corpus_flag(tmp_path, capsys):
    assert train_main([*TINY, "--corpus", "nope", "--out", str(tmp_path / "a")]) == 2
    assert "--corpus='nope' is not allowed" in _one_clear_line(capsys.readouterr().err)
    assert reproduce_main(["--preset", "tiny", "--corpus", "nope", "--out",
                           str(tmp_path / "b")]) == 2
    assert "--corpus='nope' is not allowed" in _one_clear_line(capsys.readouterr().err)


@pytest.mark.parametrize("flag, value, allowed", [
    ("--roofline-seconds", "-1", "expected a number in [0.0, 60.0]"),
    ("--repeats", "99999999999", f"expected an integer in [1, {bench.MAX_TIMED_STEPS}]"),
    ("--warmup", "99999999999", f"expected an integer in [0, {bench.MAX_TIMED_STEPS}]"),
    ("--warmup", "-1", "expected an integer in [0, "),
    ("--decode-burst", "0", "expected an integer in [1, "),
    ("--batch", "0", "expected an integer >= 1"),
    ("--d-model", "0", "expected an integer >= 2"),
    ("--threads", "0", "expected an integer >= 1"),
])
def test_bench_flags_are_checked_under_their_own_names_first(capsys, flag, value, allowed):
    start = time.perf_counter()
    assert bench_main([*BENCH_TINY, flag, value]) == 2
    line = _one_clear_line(capsys.readouterr().err)
    assert f"{flag}=" in line and allowed in line
    assert time.perf_counter() - start < 10


# --- a refused command leaves no empty folder --------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["--corpus", "nope"],
    ["--paths", "/no/such/file.txt"],
    pytest.param(["--device", "cuda"], marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="needs a machine without CUDA")),
])
def test_a_refused_train_leaves_no_folder_behind(tmp_path, capsys, argv):
    out = tmp_path / "new" / "run"
    assert train_main([*TINY, *argv, "--out", str(out)]) == 2
    _one_clear_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["--arch", "nope"], ["--workers", "-3"],
                                  ["--paths", "/no/such/file.txt"]])
def test_a_refused_reproduce_leaves_no_folder_behind(tmp_path, capsys, argv):
    out = tmp_path / "new" / "run"
    assert reproduce_main(["--preset", "tiny", *argv, "--out", str(out)]) == 2
    _one_clear_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_existed_before_is_kept_when_refused(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    assert train_main([*TINY, "--corpus", "nope", "--out", str(tmp_path / "mine")]) == 2
    assert reproduce_main(["--preset", "tiny", "--arch", "nope", "--out",
                           str(tmp_path / "mine")]) == 2
    assert (tmp_path / "mine").is_dir()


def test_the_memory_check_refuses_any_size_before_counting_on_meta():
    """``check_fits_in_memory``, the library's own check, refuses a d_model too large even to
    count on the meta device, naming d_model (torch's own count overflows there)."""
    from blockmem_lite.config import preset
    from blockmem_lite.train import check_fits_in_memory

    cfg = preset("tiny", d_model=1_000_000_000, n_head=1).model
    with pytest.raises(ValueError, match="d_model=1000000000 is not allowed: this model is too "
                                         "large for this machine"):
        check_fits_in_memory(cfg, "cpu")
