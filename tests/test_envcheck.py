"""envcheck: OK/FAIL per item, exit 1 only when a required item fails."""

import importlib

import pytest

from blockmem_lite import envcheck


def _without(monkeypatch, *missing: str) -> None:
    """Make importlib.import_module fail for ``missing`` packages (and their submodules)."""
    real = importlib.import_module

    def fake(name, package=None):
        if name.split(".")[0] in missing:
            raise ImportError(f"No module named {name!r}")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", fake)


def test_run_envcheck_reports_torch_and_kit_ok():
    items = {name: (ok, detail) for name, ok, detail in envcheck.run_envcheck()}
    assert set(envcheck.CORE + envcheck.NOTEBOOK_EXTRAS) <= set(items)
    assert {"FigureWidget", "BLOCKMEM_FAST", "BLOCKMEM_HEADLESS"} <= set(items)
    assert items["torch"][0] and "device cpu" in items["torch"][1]
    assert items["kit"][0] and "forward OK" in items["kit"][1]
    assert items["python"][0]


def test_mode_lines_say_what_the_current_state_means(monkeypatch):
    monkeypatch.delenv("BLOCKMEM_FAST", raising=False)
    monkeypatch.setenv("BLOCKMEM_HEADLESS", "1")
    items = {name: detail for name, _, detail in envcheck.run_envcheck()}
    assert items["BLOCKMEM_FAST"].startswith("not set: fast mode off, so notebooks use their "
                                             "full configs")
    assert items["BLOCKMEM_HEADLESS"] == ("BLOCKMEM_HEADLESS=1: headless mode on, so dashboards "
                                          "print text lines")


def test_main_prints_ok_lines_and_returns_0(capsys, monkeypatch):
    monkeypatch.setenv("BLOCKMEM_FAST", "1")
    assert envcheck.main([]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(line.startswith("OK   torch ") for line in lines)
    assert any(line.startswith("OK   kit ") for line in lines)
    assert "BLOCKMEM_FAST=1: fast mode on, so notebooks use tiny configs, as CI does" in out
    assert "all required items OK" in out
    # the detail column is aligned
    assert len({line.index(line.split()[2]) for line in lines[:4]}) == 1


def test_missing_notebook_extra_fails_unless_core(capsys, monkeypatch):
    _without(monkeypatch, "plotly")
    items = {name: (ok, detail) for name, ok, detail in envcheck.run_envcheck()}
    assert not items["plotly"][0] and "ImportError" in items["plotly"][1]
    assert not items["FigureWidget"][0] and "fall back to text" in items["FigureWidget"][1]
    assert envcheck.main([]) == 1
    out = capsys.readouterr().out
    assert any(line.startswith("FAIL plotly ") for line in out.splitlines())
    assert "1 required item(s) failed: plotly" in out
    assert envcheck.main(["--core"]) == 0


@pytest.mark.parametrize("missing", ["torch", "numpy"])
def test_missing_core_package_fails_even_with_core(capsys, monkeypatch, missing):
    _without(monkeypatch, missing)
    assert envcheck.main(["--core"]) == 1
    assert f"FAIL {missing} " in capsys.readouterr().out


def test_optional_items_do_not_change_the_exit_code(capsys, monkeypatch):
    _without(monkeypatch, "nbval")
    assert envcheck.main([]) == 0
    assert "[optional]" in capsys.readouterr().out
