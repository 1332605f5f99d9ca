"""Shared fixtures: deterministic CPU, tiny configs.

Tests use tiny models, which gain nothing from intra-op threads; one thread
keeps them fast and steady on a busy 2-core machine (benchmarks pin their own).
"""

import pytest
import torch

from blockmem_lite import preset

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture
def tiny_cfg():
    return preset("tiny")


# --- mutation teeth summary (tests/test_mutants.py) --------------------------------------------

_MUTANT_SUMMARY = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def mutant_summary(request):
    """A list test_mutants.py appends one dict per notebook to; printed at the end of the run."""
    return request.config.stash.setdefault(_MUTANT_SUMMARY, [])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    notebooks = config.stash.get(_MUTANT_SUMMARY, [])
    if not notebooks:
        return
    tr = terminalreporter
    tr.write_sep("=", "mutation teeth: mutants tried / killed per notebook")
    tr.write_line(f"{'notebook':<42} {'checks':>6} {'tried':>6} {'killed':>6} {'by check':>8} "
                  f"{'problems':>8} {'seconds':>8}")
    for nb in notebooks:
        rows = nb["rows"]
        killed = [r for r in rows if r["verdict"] == "killed"]
        by_check = [r for r in killed if r["kind"] in ("CheckFailed", "AssertionError")]
        tr.write_line(f"{nb['notebook']:<42} {len({r['check'] for r in rows}):>6} {len(rows):>6} "
                      f"{len(killed):>6} {len(by_check):>8} {len(nb['problems']):>8} "
                      f"{nb['seconds']:>8.0f}")
        for problem in nb["problems"]:
            tr.write_line(f"    ! {problem}")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "browser: runs the notebooks in JupyterLab in headless Chromium "
        "(skipped without Chromium or playwright); deselect with -m 'not browser'")
