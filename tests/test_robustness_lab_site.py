"""The hostile-probe findings on ``site`` and ``reproduce``, one regression test each: a
hanging cell, a bad --out and a stop of the site build; a corrupt results.json, a corrupt
stored model, a mechanism whose loss turns NaN and a SIGTERM of the comparison lab.

The site tests build tiny notebooks made here (the real ones are `make site`'s own run);
the lab tests use the tiny preset and dense alone where they can.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from nbformat.v4 import new_code_cell, new_markdown_cell
from test_site import _write

from blockmem_lite import lab, registry
from blockmem_lite.lab import run as lab_run
from blockmem_lite.tools import site
from blockmem_lite.tools.reproduce_command import reproduce_main

ROOT = Path(__file__).resolve().parent.parent


def _three_notebooks(root: Path, slow_cell: str) -> None:
    """01 and 03 quick; 02's second code cell is ``slow_cell``."""
    _write(root, "01_first.ipynb", [new_markdown_cell("# One"), new_code_cell("1 + 1")])
    _write(root, "02_slow.ipynb", [new_markdown_cell("# Two"), new_code_cell("x = 1"),
                                   new_code_cell(slow_cell)])
    _write(root, "03_after.ipynb", [new_markdown_cell("# Three"), new_code_cell("2 + 2")])


# --- site: --cell-timeout ---------------------------------------------------------------------

def test_site_a_cell_past_the_timeout_fails_its_page_only_and_the_build_exits_1(
        tmp_path, monkeypatch, capsys):
    root, out = tmp_path / "notebooks", tmp_path / "site"
    _three_notebooks(root, "import time\ntime.sleep(120)")
    monkeypatch.setattr(site, "notebooks_dir", lambda: root)
    assert site.main(["--out", str(out), "--cell-timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert "1 of 3 notebooks have no page: 02_slow.ipynb: cell 2 ('import time') ran past " \
           "--cell-timeout 2 s" in err and "Traceback" not in err
    assert (out / "01_first.html").is_file() and (out / "03_after.html").is_file()
    assert "This page was not built" in (out / "02_slow.html").read_text()
    index = (out / "index.html").read_text()
    assert 'href="03_after.html"' in index and 'href="02_slow.html"' in index
    assert "Not built:</b> cell 2 (&#x27;import time&#x27;) ran past --cell-timeout 2 s" in index
    assert err.strip().splitlines()[-1].startswith("site: 1 of 3 notebooks have no page")


@pytest.mark.parametrize("value", ["0", "-3", "1.5", "soon"])
def test_site_the_cell_timeout_is_whole_seconds_of_at_least_one(value, capsys):
    with pytest.raises(SystemExit) as stop:
        site.main(["--cell-timeout", value])
    assert stop.value.code == 2
    assert f"--cell-timeout: {value!r} is not allowed: expected whole seconds >= 1" \
        in capsys.readouterr().err


def test_site_build_refuses_a_bad_cell_timeout(tmp_path):
    with pytest.raises(site.SiteError, match="--cell-timeout 0 is not allowed"):
        site.build(tmp_path, cell_timeout=0, log=lambda line: None)


# --- site: --out and stopping --------------------------------------------------------------

@pytest.mark.parametrize("where", ["afile", "afile/sub"])
def test_site_a_bad_out_is_refused_before_any_notebook_runs(tmp_path, monkeypatch, capsys,
                                                             where):
    root = tmp_path / "notebooks"
    _write(root, "01_first.ipynb", [new_code_cell("1 + 1")])
    monkeypatch.setattr(site, "notebooks_dir", lambda: root)
    (tmp_path / "afile").write_text("not a folder")
    assert site.main(["--out", str(tmp_path / where)]) == 2
    captured = capsys.readouterr()
    assert f"--out='{tmp_path / where}' is not allowed: {tmp_path / 'afile'} is a file" \
        in captured.err
    assert "running" not in captured.out


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="root writes into read-only folders")
def test_site_an_unwritable_out_is_refused(tmp_path, monkeypatch, capsys):
    root, out = tmp_path / "notebooks", tmp_path / "locked"
    _write(root, "01_first.ipynb", [new_code_cell("1 + 1")])
    monkeypatch.setattr(site, "notebooks_dir", lambda: root)
    out.mkdir()
    out.chmod(0o500)
    try:
        assert site.main(["--out", str(out)]) == 2
    finally:
        out.chmod(0o700)
    assert "it cannot be written" in capsys.readouterr().err


DRIVER = ("import sys; from pathlib import Path; from blockmem_lite.tools import site; "
          "site.notebooks_dir = lambda: Path(sys.argv[1]); sys.exit(site.main(sys.argv[2:]))")


def _default_stop_signals() -> None:
    """In the child: default SIGINT/SIGTERM, whatever the test runner's shell left."""
    for name in ("SIGINT", "SIGTERM"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)


def _gone(pid: int, within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("name, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_site_a_stop_mid_notebook_is_one_line_no_partial_page_and_no_kernel_left(
        tmp_path, name, code):
    root, out, marker = tmp_path / "notebooks", tmp_path / "site", tmp_path / "kernel.pid"
    _three_notebooks(root, f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))"
                           "\ntime.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(root), "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_stop_signals)
    try:
        deadline = time.monotonic() + 180
        while not (marker.is_file() and marker.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        kernel = int(marker.read_text())                  # 02's kernel is in its cell
        proc.send_signal(getattr(signal, name))
        _, stderr = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == code, stderr
    assert "site: interrupted" in stderr and "Traceback" not in stderr, stderr
    assert (out / "01_first.html").is_file() and not (out / "02_slow.html").exists()
    assert not [p.name for p in out.rglob("*.tmp")]
    assert _gone(kernel), "the notebook's kernel was left running"


# --- reproduce: stored files ---------------------------------------------------------------

@pytest.mark.parametrize("content", [b"{nope", b"[]", b'{"meta": 1, "done": {}}', b"\xff\xfe"])
def test_reproduce_a_corrupt_results_json_names_the_file_and_what_to_do(tmp_path, capsys,
                                                                          content):
    (tmp_path / lab.RESULTS_NAME).write_bytes(content)
    assert reproduce_main(["--preset", "tiny", "--arch", "dense", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"error: {tmp_path / lab.RESULTS_NAME} " in err
    assert "move it away to keep it, or delete it to start this run over" in err
    assert (tmp_path / lab.RESULTS_NAME).read_bytes() == content        # left as it was


def _save_other_weights(path: Path) -> None:
    torch.save({"not_a_weight": torch.zeros(1)}, path)


@pytest.mark.parametrize("damage, reason", [
    (lambda path: path.write_bytes(b"garbage"), "it is empty, truncated or not a saved model"),
    (lambda path: path.write_bytes(b""), "it is empty, truncated or not a saved model"),
    (_save_other_weights, "its weights are not this entry's model's"),
])
def test_reproduce_a_corrupt_stored_model_names_the_file_and_what_to_do(tmp_path, capsys,
                                                                          damage, reason):
    """ARMT starts from the trained dense model, stored in OUT/models/dense.pt; a resumed
    run that finds it damaged says so instead of a torch traceback."""
    lab.Lab("tiny", tmp_path, archs=["armt"], progress=False)._store("lm/dense",
                                                                    {"arch": "dense"})
    (tmp_path / "models").mkdir()
    damage(tmp_path / "models" / "dense.pt")
    assert reproduce_main(["--preset", "tiny", "--arch", "armt", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"the stored model {tmp_path / 'models' / 'dense.pt'} cannot be used ({reason})" in err
    assert f'Delete it and the "lm/dense" entry of {tmp_path / lab.RESULTS_NAME}' in err


# --- reproduce: a broken mechanism and stops ------------------------------------------------

NAN_PLUGIN = '''
from blockmem_lite import Mechanism, register_mechanism
from blockmem_lite.models.dense import DenseLM


class NanAfterThree(DenseLM):
    """Dense, whose training loss turns NaN at its fourth training step (the Trainer's
    memory estimate runs batches of 1 and 2 sequences first: not counted)."""

    calls = 0

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        if self.training and out.loss is not None and args[0].shape[0] > 2:
            NanAfterThree.calls += 1
            if NanAfterThree.calls > 3:
                out.loss = out.loss * float("nan")
        return out


register_mechanism(Mechanism(name="nan_after_three", model=NanAfterThree,
                             summary="its loss turns NaN (a test plugin)"))
'''


@pytest.fixture
def nan_plugin(tmp_path):
    path = tmp_path / "nan_plugin.py"
    path.write_text(textwrap.dedent(NAN_PLUGIN))
    yield path
    registry.unregister("nan_after_three")


def test_reproduce_a_nan_loss_names_the_mechanism_and_the_step(tmp_path, capsys, nan_plugin):
    out = tmp_path / "out"
    assert reproduce_main(["--preset", "tiny", "--plugin", str(nan_plugin), "--arch",
                           "nan_after_three", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert (f"error: lm/nan_after_three: training the nan_after_three model (plugin "
            f"{nan_plugin}) failed: non-finite training signal at step 4/20") in err
    assert f"The finished tasks are kept in {out / lab.RESULTS_NAME}" in err
    assert set(json.loads((out / lab.RESULTS_NAME).read_text())["done"]) == {"lm/dense"}


@pytest.mark.usefixtures("interactive_sigint")
@pytest.mark.parametrize("name, code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_reproduce_a_signal_exits_128_plus_its_number_and_keeps_the_results(
        tmp_path, monkeypatch, capsys, name, code):
    """The signal arrives while the second task (recall/dense) trains: the first stays."""
    number = getattr(signal, name)
    real = lab_run.PlanProgress.on_step

    def signal_in_recall(self, trainer, rec):
        if self.current.startswith("recall") and rec["step"] == 2:
            handler = signal.getsignal(number)
            assert handler not in (signal.SIG_DFL, signal.default_int_handler), \
                "the trainer's stop button is not installed"
            signal.raise_signal(number)
        return real(self, trainer, rec)

    monkeypatch.setattr(lab_run.PlanProgress, "on_step", signal_in_recall)
    assert reproduce_main(["--preset", "tiny", "--arch", "dense", "--out", str(tmp_path)]) == code
    err = capsys.readouterr().err
    assert "run the same command again to continue" in err
    assert set(json.loads((tmp_path / lab.RESULTS_NAME).read_text())["done"]) == {"lm/dense"}


def test_site_a_kernel_that_dies_fails_with_the_notebook_and_cell_named(tmp_path):
    root = tmp_path / "notebooks"
    _write(root, "01_dies.ipynb", [new_code_cell("x = 1"), new_code_cell("import os\nos._exit(1)")])
    with pytest.raises(site.SiteError, match=r"01_dies.ipynb: the kernel died in cell 1 "
                                             r"\('import os'\)"):
        site.build(tmp_path / "site", root=root, log=lambda line: None)
    assert "the kernel died in cell 1" in (tmp_path / "site" / "01_dies.html").read_text()
