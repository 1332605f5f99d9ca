"""expected: the ranges notebooks print after their results, and the command that makes them."""

import json

import pytest

from blockmem_lite import config, expected
from blockmem_lite.tools import expected_runs


@pytest.fixture
def stored(tmp_path, monkeypatch):
    """A ranges file with one fast-mode entry, read by ``expect``."""
    path = tmp_path / "ranges.json"
    values = {"02.loss": {0: 3.0, 1: 3.2, 2: 3.1}}
    expected_runs.store(values, ["02"], "fast", [0, 1, 2], path=path)
    monkeypatch.setattr(expected, "ranges_path", lambda: path)
    monkeypatch.setenv("BLOCKMEM_FAST", "1")
    monkeypatch.delenv(expected.STRICT_ENV, raising=False)
    return path


def test_measured_range_pads_half_the_spread_and_one_percent_at_least():
    assert expected.measured_range([3.0, 3.2, 3.1]) == pytest.approx((2.9, 3.3))
    low, high = expected.measured_range([2.0, 2.0, 2.0])
    assert (low, high) == pytest.approx((1.98, 2.02))
    assert expected.measured_range([0.2, 2.0, 1.0])[0] == 0.0          # a ratio stays >= 0
    assert expected.measured_range([-0.2, 0.1, 0.0])[0] == pytest.approx(-0.35)


def test_a_bounded_result_never_reads_above_its_bound(tmp_path, monkeypatch, capsys):
    """Three seeds at 0.5, 0.875 and 0.44 pad to 1.09; an accuracy's range stops at 1."""
    seeds = [0.5, 0.875, 0.4375]
    assert expected.measured_range(seeds)[1] > 1
    assert expected.measured_range(seeds, at_most=1)[1] == 1
    assert expected.measured_range([1.0, 1.0, 1.0], at_most=1) == pytest.approx((0.99, 1.0))
    path = tmp_path / "ranges.json"
    expected_runs.store({"09.recall": {0: 0.5, 1: 0.875, 2: 0.4375, "at_most": 1}}, ["09"],
                        "fast", [0, 1, 2], path=path)
    assert expected.load_ranges(path)["fast"]["09.recall"]["high"] == 1
    monkeypatch.setattr(expected, "ranges_path", lambda: path)
    monkeypatch.setenv("BLOCKMEM_FAST", "1")
    monkeypatch.delenv(expected.STRICT_ENV, raising=False)      # make test sets it
    expected.expect("09.recall", 0.9, outside="x", at_most=1)
    assert "to 1 (" in capsys.readouterr().out
    with pytest.raises(ValueError, match="at_most"):
        expected.expect("09.recall", 0.9, outside="x", at_most="1")


def test_a_signed_difference_may_read_below_zero(tmp_path, monkeypatch, capsys):
    """Three positive gaps (0.125, 0.026, 0.101) say little about a fourth seed's sign: a
    difference's range is padded below zero; a loss's stops at zero."""
    gaps = [0.125, 0.026, 0.101]
    assert expected.measured_range(gaps)[0] == 0.0
    low, high = expected.measured_range(gaps, signed=True)
    assert low == pytest.approx(0.026 - 0.0495) and high == pytest.approx(0.125 + 0.0495)
    path = tmp_path / "ranges.json"
    expected_runs.store({"03.gap": {0: 0.125, 1: 0.026, 2: 0.101, "signed": True}}, ["03"],
                        "fast", [0, 1, 2], path=path)
    assert expected.load_ranges(path)["fast"]["03.gap"]["low"] < 0
    monkeypatch.setattr(expected, "ranges_path", lambda: path)
    monkeypatch.setenv("BLOCKMEM_FAST", "1")
    monkeypatch.delenv(expected.STRICT_ENV, raising=False)      # make test sets it
    expected.expect("03.gap", -0.01, outside="x", signed=True)
    assert "inside" in capsys.readouterr().out
    expected.expect("03.gap", -0.01, outside="x")
    assert "OUTSIDE" in capsys.readouterr().out


def test_inside_and_outside_are_said(stored, capsys):
    assert expected.expect("02.loss", 3.05, unit="nats", outside="the memory did not train") is None
    line = capsys.readouterr().out
    assert "2.9 to 3.3 nats" in line and "inside" in line and "seeds 0-2" in line
    expected.expect("02.loss", 4.0, unit="nats", outside="the memory did not train")
    line = capsys.readouterr().out
    assert line.startswith("OUTSIDE") and "the memory did not train" in line


def test_nan_is_outside(stored, capsys):
    expected.expect("02.loss", float("nan"), outside="training diverged")
    assert capsys.readouterr().out.startswith("OUTSIDE")


def test_strict_mode_fails_outside_and_missing_but_only_flags_machine_results(stored, monkeypatch,
                                                                             capsys):
    monkeypatch.setenv(expected.STRICT_ENV, "1")
    expected.expect("02.loss", 3.1, outside="x")
    with pytest.raises(expected.OutsideExpected, match="02.loss"):
        expected.expect("02.loss", 9.0, outside="x")
    with pytest.raises(expected.OutsideExpected, match="no measured range"):
        expected.expect("02.unknown", 1.0, outside="x")
    capsys.readouterr()
    expected.expect("02.loss", 9.0, outside="a busy machine", machine=True)
    assert "OUTSIDE" in capsys.readouterr().out


def test_the_class_preset_reads_its_own_ranges(stored, monkeypatch, capsys):
    monkeypatch.setenv("BLOCKMEM_FAST", "0")
    config.notebook_config("class", arch="bcmt")
    assert expected.current_preset() == "class"
    expected.expect("02.loss", 3.1, outside="x")
    assert "no measured range" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["loss", "2.loss", "02.Loss", "02.", "02.loss_1", ""])
def test_bad_names_are_refused(name):
    with pytest.raises(ValueError, match="two-digit"):
        expected.expect(name, 1.0, outside="x")


def test_outside_must_be_said():
    with pytest.raises(ValueError, match="outside"):
        expected.expect("02.loss", 1.0, outside="")


def test_record_appends_every_result(tmp_path, monkeypatch):
    record = tmp_path / "rec.jsonl"
    monkeypatch.setenv(expected.RECORD_ENV, str(record))
    monkeypatch.delenv(expected.STRICT_ENV, raising=False)
    monkeypatch.setattr(expected, "ranges_path", lambda: tmp_path / "none.json")
    expected.expect("03.gap", 0.5, outside="x")
    expected.expect("03.ratio", 2.0, outside="x")
    expected.expect("03.recall", 0.5, outside="x", at_most=1)
    expected.expect("03.diff", -0.5, outside="x", signed=True)
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert rows == [{"name": "03.gap", "value": 0.5}, {"name": "03.ratio", "value": 2.0},
                    {"name": "03.recall", "value": 0.5, "at_most": 1},
                    {"name": "03.diff", "value": -0.5, "signed": True}]


def test_store_replaces_only_the_notebooks_remade(stored):
    expected_runs.store({"03.gap": {0: 1.0, 1: 1.0, 2: 1.0}}, ["03"], "fast", [0, 1, 2],
                        path=stored)
    expected_runs.store({"02.other": {4: 1.0, 5: 2.0, 7: 3.0}}, ["02"], "fast", [4, 5, 7],
                        path=stored)
    entries = expected.load_ranges(stored)["fast"]
    assert set(entries) == {"03.gap", "02.other"}          # 02.loss went with 02's remake
    assert entries["02.other"]["seeds"] == "4, 5, 7"


def test_store_refuses_a_result_missing_from_one_seed(tmp_path):
    with pytest.raises(SystemExit, match="seeds"):
        expected_runs.store({"02.loss": {0: 1.0, 1: 1.0}}, ["02"], "fast", [0, 1, 2],
                            path=tmp_path / "r.json")


def test_seed_env_sets_the_notebook_seed_and_bad_values_are_named(monkeypatch):
    monkeypatch.setenv(config.SEED_ENV, "7")
    assert config.notebook_config("class", arch="bcmt").train.seed == 7
    assert config.notebook_config("class", arch="bcmt", seed=3).train.seed == 3
    monkeypatch.setenv(config.SEED_ENV, "seven")
    with pytest.raises(ValueError, match="BLOCKMEM_SEED.*seven"):
        config.notebook_config("class", arch="bcmt")


@pytest.mark.parametrize("argv, message", [
    (["remake", "--seeds", "0", "1"], "at least 3"),
    (["remake", "--notebooks", "2"], "not a notebook number"),
    (["remake", "--notebooks", "99"], "not a notebook number"),
])
def test_remake_refuses_bad_arguments_before_any_run(argv, message, capsys):
    with pytest.raises(SystemExit, match=message):
        expected_runs.main(argv)


def test_the_stored_ranges_cover_three_seeds_and_hold_their_values():
    presets = expected.load_ranges()
    assert "fast" in presets and presets["fast"]
    for preset, entries in presets.items():
        for name, entry in entries.items():
            assert expected.NAME.fullmatch(name), name
            assert len(entry["values"]) >= 3, (preset, name)
            assert all(entry["low"] <= v <= entry["high"] for v in entry["values"].values())


# Results a notebook prints only under the class preset (a sweep fast mode leaves out). Names
# built at run time (f-strings) are not seen here: the strict nbval run holds those.
CLASS_PRESET_ONLY = {"07.armt-peak-growth"}


def test_every_result_a_notebook_expects_has_a_fast_range():
    import re

    from blockmem_lite.course import course_root

    calls = re.compile(r"""expect\(\s*["'](\d\d\.[a-z0-9-]+)["']""")
    named = set()
    for path in sorted((course_root() / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for cell in cells:
            named |= set(calls.findall("".join(cell["source"])))
    assert named, "no notebook calls expect()"
    fast = set(expected.load_ranges().get("fast", {}))
    missing = sorted(named - fast - CLASS_PRESET_ONLY)
    assert not missing, f"no stored fast-mode range for {missing}: run expected remake"


def test_a_remake_names_the_slowest_cells_of_each_run():
    import nbformat

    notebook = nbformat.v4.new_notebook()
    for cell_id, seconds in (("quick", 1.0), ("slow", 75.5), ("unrun", None), ("mid", 9.0)):
        cell = nbformat.v4.new_code_cell("pass")
        cell.id = cell_id
        if seconds is not None:
            cell.metadata["execution"] = {
                "iopub.execute_input": "2026-12-07T05:00:00.000000Z",
                "shell.execute_reply": f"2026-12-07T05:{int(seconds) // 60:02d}:"
                                       f"{seconds % 60:09.6f}Z"}
        notebook.cells.append(cell)
    assert expected_runs.slowest_cells(notebook, count=2) == "slow 76 s, mid 9 s"
    assert expected_runs.slowest_cells(nbformat.v4.new_notebook()) == "(no timings)"
