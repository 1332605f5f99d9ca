"""Shared fixtures: deterministic CPU, tiny configs.

Tests use tiny models, which gain nothing from intra-op threads; one thread
keeps them fast and steady on a busy 2-core machine (benchmarks pin their own).
"""

import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

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


def pytest_sessionfinish(session):
    """Under pytest-xdist a worker hands its notebooks' rows to the controller, which prints."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["mutant_summary"] = \
            session.config.stash.get(_MUTANT_SUMMARY, [])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller's side of ``pytest_sessionfinish`` (pytest-xdist's hook)."""
    rows = getattr(node, "workeroutput", {}).get("mutant_summary", [])
    node.config.stash.setdefault(_MUTANT_SUMMARY, []).extend(rows)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    notebooks = config.stash.get(_MUTANT_SUMMARY, [])
    if not notebooks:
        return
    tr = terminalreporter
    tr.write_sep("=", "mutation teeth: mutants and cheating mutants tried / killed per notebook")
    tr.write_line(f"{'notebook':<42} {'checks':>6} {'tried':>6} {'killed':>6} {'by check':>8} "
                  f"{'cheats':>6} {'killed':>6} {'problems':>8} {'seconds':>8}")
    for nb in notebooks:
        rows = [r for r in nb["rows"] if not r["cheat"]]
        cheats = [r for r in nb["rows"] if r["cheat"]]
        killed = [r for r in rows if r["verdict"] == "killed"]
        by_check = [r for r in killed if r["kind"] in ("CheckFailed", "AssertionError")]
        tr.write_line(f"{nb['notebook']:<42} {len({r['check'] for r in rows}):>6} {len(rows):>6} "
                      f"{len(killed):>6} {len(by_check):>8} {len(cheats):>6} "
                      f"{sum(r['verdict'] == 'killed' for r in cheats):>6} "
                      f"{len(nb['problems']):>8} {nb['seconds']:>8.0f}")
        for problem in nb["problems"]:
            tr.write_line(f"    ! {problem}")


def pytest_configure(config):
    # Every notebook kernel and subprocess of the session keeps its runs in one fresh folder:
    # nothing a developer trained in runs/ is read or overwritten, and the fast lab run is
    # made once (fast_reproduce) for the lab tests, notebook 10 and its exercise copy.
    os.environ["BLOCKMEM_RUNS"] = tempfile.mkdtemp(prefix="blockmem-test-runs-")
    config.addinivalue_line(
        "markers", "browser: runs the notebooks in JupyterLab in headless Chromium "
        "(skipped without Chromium or playwright); deselect with -m 'not browser'")


def pytest_unconfigure(config):
    shutil.rmtree(os.environ.get("BLOCKMEM_RUNS", ""), ignore_errors=True)


@pytest.fixture(scope="session")
def fast_reproduce():
    """``reproduce --preset fast`` run once, where notebook 10 looks for it: (out, results)."""
    from blockmem_lite import lab
    from blockmem_lite.corpora import runs_dir
    from blockmem_lite.tools.reproduce_command import reproduce_main

    out = runs_dir() / "reproduce_fast"
    assert str(out).startswith(os.environ["BLOCKMEM_RUNS"]), "the session's own runs folder"
    # notebook 10, run by nbval on this worker before a test asked for this, may have made
    # one already (through the library, without the command line's plots): start afresh
    shutil.rmtree(out, ignore_errors=True)
    assert reproduce_main(["--preset", "fast", "--out", str(out)]) == 0
    return Path(out), json.loads((out / lab.RESULTS_NAME).read_text())


@pytest.fixture
def interactive_sigint():
    """Ctrl-C as an interactive lab gets it: SIGINT at its default handler for the test,
    whatever the test runner left (a pytest-xdist worker may ignore it, and the stop
    button rightly leaves an ignored signal alone)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
