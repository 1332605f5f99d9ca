"""The versions the kit is tested with: requirements.lock, pyproject.toml's ranges, the
Makefile's pins and environment.yml agree, so every install route gets the tested set."""

import re
from pathlib import Path

import pytest

from blockmem_lite.tools import envcheck

tomllib = pytest.importorskip("tomllib")
requirements = pytest.importorskip("packaging.requirements")

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
LOCKED = envcheck.read_lock(ROOT / "requirements.lock")


def _declared() -> list:
    """Every requirement pyproject.toml declares (core, notebooks, test, hf)."""
    lines = PYPROJECT["dependencies"] + [
        line for extra, deps in PYPROJECT["optional-dependencies"].items() if extra != "dev"
        for line in deps]
    return [requirements.Requirement(line) for line in lines]


def _makefile_value(name: str) -> str:
    match = re.search(rf"^{name}\s*:?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert match, f"the Makefile sets no {name}"
    return match[1]


def _lower_bound(package: str) -> str:
    bounds = {spec.version for req in _declared() if envcheck.normalize(req.name) == package
              for spec in req.specifier if spec.operator == ">="}
    assert len(bounds) == 1, f"{package}: expected one declared minimum, got {bounds}"
    return bounds.pop()


@pytest.mark.parametrize("req", _declared(), ids=str)
def test_every_declared_package_is_locked_inside_its_range(req):
    name = envcheck.normalize(req.name)
    assert name in LOCKED, f"{req.name} is declared in pyproject.toml but not locked: make lock"
    assert req.specifier.contains(LOCKED[name]), (
        f"{req.name}=={LOCKED[name]} in requirements.lock is outside {req.specifier}: make lock")


@pytest.mark.parametrize("req", _declared(), ids=str)
def test_every_range_stops_before_a_major_release(req):
    assert any(spec.operator == "<" for spec in req.specifier), (
        f"{req} has no upper bound: a plain pip install would take an untested major release")


def test_the_makefile_torch_is_the_locked_torch():
    assert LOCKED["torch"] == _makefile_value("TORCH_VERSION")


@pytest.mark.parametrize("package, variable",
                         [("torch", "MIN_TORCH"), ("transformers", "MIN_TRANSFORMERS")])
def test_make_test_oldest_runs_the_declared_minimums(package, variable):
    assert _makefile_value(variable) == _lower_bound(package)


def test_environment_yml_installs_the_locked_versions():
    text = (ROOT / "environment.yml").read_text()
    assert f"- torch=={LOCKED['torch']}" in text
    assert "- -c requirements.lock" in text and "- -e .[notebooks]" in text


def test_the_readme_names_the_tested_versions():
    readme = (ROOT / "README.md").read_text()
    for package in ("torch", "transformers"):
        assert f"{package} {LOCKED[package]}" in readme, f"README: {package} {LOCKED[package]}"
        assert f"{package} {_lower_bound(package)}" in readme
