"""Plugins and checkpoints a user gets wrong get a clear error: one regression test per finding
of the hostile-probe round on plugins (``registry.load_plugin``, ``--plugin FILE``), the
LanguageModel contract the Trainer checks on its first step, and checkpoints that are not
finite or of another architecture (``load_model``, ``Trainer.from_checkpoint``, ``restore``).
"""

import importlib
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from blockmem_lite import build_model, load_plugin, preset, registry
from blockmem_lite.__main__ import main
from blockmem_lite.checkpoints import CheckpointError
from blockmem_lite.models.base import ModelOutput
from blockmem_lite.models.dense import DenseLM
from blockmem_lite.tools.train_command import train_main
from blockmem_lite.train import Trainer
from blockmem_lite.train.resume import load_model

IMPORTS = ("from blockmem_lite import Mechanism, register_mechanism\n"
           "from blockmem_lite.models.dense import DenseLM\n")


def _plugin(folder: Path, name: str, body: str) -> Path:
    """A plugin file ``folder/name.py`` holding the kit's imports, then ``body``."""
    path = folder / f"{name}.py"
    path.write_text(IMPORTS + textwrap.dedent(body))
    return path


def _registering(folder: Path, file: str, arch: str, cls: str) -> Path:
    """A plugin file registering ``arch`` with a DenseLM subclass called ``cls``."""
    return _plugin(folder, file, f"""
        class {cls}(DenseLM):
            pass

        register_mechanism(Mechanism(name={arch!r}, model={cls}, summary="probe"))
    """)


@pytest.fixture
def forget():
    """Names to unregister after the test (the registry is one per process)."""
    names = []
    yield names
    for name in names:
        registry.unregister(name)


def _data(n=8, t=16):
    x = torch.randint(0, 256, (n, t + 1), generator=torch.Generator().manual_seed(0))
    return TensorDataset(x[:, :-1].clone(), x[:, 1:].clone())


def _cfg(folder=None, **overrides):
    """A tiny run config (T=16), checkpoints into ``folder`` when one is given."""
    return preset("tiny", seq_len=16, **{"steps": 2, "batch_size": 4, "warmup_steps": 1,
                                         "eval_every": 100, **overrides},
                  checkpoint_dir=str(folder) if folder else None)


def _checkpoint(folder: Path) -> Path:
    """A good checkpoint of a tiny dense run (one step) in ``folder``."""
    cfg = _cfg(folder, steps=1)
    Trainer(build_model(cfg), cfg, _data(), callbacks=[]).fit()
    return folder / "checkpoint.pt"


# --- 1a. one name, two sources -----------------------------------------------------------------

def test_1a_a_second_plugin_with_the_same_name_is_refused_naming_both(tmp_path, forget, capsys):
    first = _registering(tmp_path, "first", "dupe_r3", "FirstLM")
    second = _registering(tmp_path, "second", "dupe_r3", "SecondLM")
    forget.append("dupe_r3")
    assert load_plugin(first) == ["dupe_r3"]
    with pytest.raises(ValueError, match="already registered by") as caught:
        load_plugin(second)
    assert str(first) in str(caught.value) and str(second) in str(caught.value)
    assert "FirstLM" in str(caught.value) and "SecondLM" in str(caught.value)
    assert registry.get("dupe_r3").model.__name__ == "FirstLM"     # the first one stays
    assert registry.source("dupe_r3") == str(first)
    assert train_main(["--plugin", str(first), "--plugin", str(second), "--preset", "tiny",
                       "--arch", "dupe_r3", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(first) in err and str(second) in err and "Traceback" not in err


def test_1a_a_built_in_name_is_refused_naming_the_plugin(tmp_path):
    path = _registering(tmp_path, "fake_dense", "dense", "FakeDense")
    with pytest.raises(ValueError, match=r"name='dense' is not allowed: a built-in mechanism "
                                         r"has that name \(this one from plugin .*fake_dense"
                                         r"\.py\); choose another"):
        load_plugin(path)
    assert registry.source("dense") == registry.BUILTIN
    assert registry.get("dense").model is DenseLM


def _run_cell(source: str) -> None:
    """Run ``source`` as a notebook cell runs: in a namespace called ``__main__``."""
    exec(compile(source, "<cell>", "exec"), {"__name__": "__main__"})


NOTEBOOK_11_CELL = IMPORTS + textwrap.dedent("""
    class SlidingWindowLM(DenseLM):
        pass

    SWA = register_mechanism(Mechanism(name="swa_nb_r3", model=SlidingWindowLM, summary="nb"))
""")
EXERCISE_11_CELL = IMPORTS + textwrap.dedent("""
    register_mechanism(Mechanism(name="swa_ex_r3", model=lambda c: DenseLM(c), summary="ex"))
""")


@pytest.mark.parametrize("cell, name", [(NOTEBOOK_11_CELL, "swa_nb_r3"),
                                        (EXERCISE_11_CELL, "swa_ex_r3")])
def test_1a_a_notebook_cell_run_twice_keeps_working(cell, name, forget):
    forget.append(name)
    _run_cell(cell)
    first = registry.get(name)
    _run_cell(cell)                                    # the class is defined again: replaced
    assert registry.get(name) is not first and registry.source(name) == ""


def test_1a_another_class_under_a_session_name_is_refused(forget):
    forget.append("swa_nb_r3")
    _run_cell(NOTEBOOK_11_CELL)
    with pytest.raises(ValueError, match=r"already registered by this session .*SlidingWindowLM"
                                         r".*RenamedLM.*unregister\('swa_nb_r3'\)"):
        _run_cell(NOTEBOOK_11_CELL.replace("SlidingWindowLM", "RenamedLM"))


def test_1a_a_plugin_loaded_twice_or_imported_keeps_its_entry(tmp_path, forget, monkeypatch):
    path = _registering(tmp_path, "twice_r3_file", "twice_r3", "TwiceLM")
    forget.append("twice_r3")
    assert load_plugin(path) == load_plugin(path) == ["twice_r3"]
    assert load_plugin(str(path)) == ["twice_r3"]
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "twice_r3_file", raising=False)
    importlib.import_module("twice_r3_file")         # the same file, imported as a module
    assert registry.source("twice_r3") == str(path)
    assert registry.get("twice_r3").model.__module__ == "twice_r3_file"
    sys.modules.pop("twice_r3_file")


# --- 1b. sys.exit and other exceptions while the file runs -------------------------------------

def test_1b_sys_exit_in_a_plugin_is_a_clear_error(tmp_path, capsys):
    path = _plugin(tmp_path, "exits", "import sys\nsys.exit(3)\n")
    with pytest.raises(ValueError, match=r"plugin .*exits\.py failed to import: it raised "
                                         r"SystemExit \(sys\.exit\(3\)\)"):
        load_plugin(path)
    assert train_main(["--plugin", str(path), "--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "SystemExit" in err


def test_1b_a_plugin_that_fails_after_registering_leaves_nothing_registered(tmp_path):
    path = _plugin(tmp_path, "half", """
        class HalfLM(DenseLM):
            pass

        register_mechanism(Mechanism(name="half_r3", model=HalfLM, summary="half"))
        raise RuntimeError("broken after registering")
    """)
    with pytest.raises(ValueError, match=r"RuntimeError: broken after registering \(line 8 of "
                                         r"the plugin\)"):
        load_plugin(path)
    assert "half_r3" not in registry.names()
    with pytest.raises(ValueError, match="RuntimeError"):   # and again: still refused, clearly
        load_plugin(path)


# --- 1c. a helper file beside the plugin ---------------------------------------------------------

def test_1c_a_plugin_imports_a_helper_file_beside_it(tmp_path, forget):
    helper = "r3_window_helper"
    (tmp_path / f"{helper}.py").write_text("from blockmem_lite.models.dense import DenseLM\n\n"
                                           "class HelperLM(DenseLM):\n    pass\n")
    path = _plugin(tmp_path, "uses_helper", f"""
        from {helper} import HelperLM

        register_mechanism(Mechanism(name="helped_r3", model=HelperLM, summary="helper"))
    """)
    forget.append("helped_r3")
    before = list(sys.path)
    try:
        assert load_plugin(path) == ["helped_r3"]
    finally:
        sys.modules.pop(helper, None)
    assert registry.get("helped_r3").model.__name__ == "HelperLM"
    assert sys.path == before                          # importable while it ran, not after


def test_1c_a_helper_that_raises_names_the_plugin_line_and_the_helper(tmp_path):
    helper = "r3_broken_helper"
    (tmp_path / f"{helper}.py").write_text("def build():\n    raise KeyError('no such knob')\n")
    path = _plugin(tmp_path, "calls_helper", f"import {helper}\n{helper}.build()\n")
    try:
        with pytest.raises(ValueError, match=r"calls_helper\.py failed to import: KeyError: "
                                             r"'no such knob' \(line 4 of the plugin; raised "
                                             r"in r3_broken_helper\.py, line 2, in build\)"):
            load_plugin(path)
    finally:
        sys.modules.pop(helper, None)


# --- 1e. other plugin mistakes --------------------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.py", r"plugin='.*missing\.py' is not allowed: expected an existing "
                                 r"\.py file"),
    (lambda d: d, r"plugin='.*' is not allowed: expected an existing \.py file"),
    (lambda d: (d / "notes.txt", (d / "notes.txt").write_text("x"))[0],
     r"notes\.txt' is not allowed: expected an existing \.py file"),
    (lambda d: _plugin(d, "syntax", "def f(:\n"), r"syntax\.py failed to import: SyntaxError: "
                                                  r".*line 3"),
    (lambda d: _plugin(d, "nothing", "x = 1\n"), r"nothing\.py registered no mechanism: it must "
                                                 r"call blockmem_lite\.register_mechanism"),
    (lambda d: _plugin(d, "bad_name", "register_mechanism(Mechanism(name='Bad', model=DenseLM))"),
     r"bad_name\.py failed to import: ValueError: name='Bad' is not allowed"),
    (lambda d: None, r"plugin=None is not allowed: expected an existing \.py file"),
    (lambda d: "", r"plugin='' is not allowed: expected an existing \.py file"),
])
def test_1e_plugin_mistakes_are_clear_errors(tmp_path, capsys, make, message):
    path = make(tmp_path)
    with pytest.raises(ValueError, match=message):
        load_plugin(path)
    if path:                                            # the command line: exit 2, no traceback
        assert train_main(["--plugin", str(path), "--preset", "tiny"]) == 2
        err = capsys.readouterr().err
        assert "plugin" in err and "Traceback" not in err


# --- 1d. the LanguageModel contract on the first training step ----------------------------------

class _Broken(DenseLM):
    """A dense model whose forward breaks the contract in the way ``how`` says."""

    how = "short"

    def forward(self, tokens, targets=None):
        out = super().forward(tokens, targets)
        if self.how == "short":                                  # T - 1 logits
            return ModelOutput(out.logits[:, :-1], out.loss)
        if self.how == "vocab":                                  # another vocabulary
            return ModelOutput(out.logits[..., :100], out.loss)
        if self.how == "no_loss":
            return ModelOutput(out.logits)
        if self.how == "vector_loss":
            return ModelOutput(out.logits, out.loss.expand(tokens.shape[0]))
        if self.how == "nan_loss":
            return ModelOutput(out.logits, out.loss * float("nan"))
        if self.how == "detached":
            return ModelOutput(out.logits, out.loss.detach())
        return (out.logits, out.loss)                            # a tuple, not a ModelOutput


@pytest.mark.parametrize("how, message", [
    ("short", r"logits of shape \(4, 15, 256\): expected \(4, 16, 256\) = \(batch, time, "
              r"vocab_size\)"),
    ("vocab", r"logits of shape \(4, 16, 100\): expected \(4, 16, 256\)"),
    ("no_loss", r"loss=None: expected a scalar tensor"),
    ("vector_loss", r"loss=\(4,\): expected a scalar tensor"),
    ("nan_loss", r"loss=nan before any update: expected a finite number"),
    ("detached", r"a loss without a gradient"),
    ("tuple", r"returned tuple without logits: expected a ModelOutput"),
])
def test_1d_a_forward_that_breaks_the_contract_fails_on_the_first_step(how, message,
                                                                       monkeypatch):
    monkeypatch.setattr(_Broken, "how", how)
    cfg = _cfg()
    trainer = Trainer(_Broken(cfg.model), cfg, _data(), callbacks=[])
    with pytest.raises(ValueError, match=r"mechanism 'dense' \(_Broken\) breaks the "
                                         r"LanguageModel contract on the first training step: "
                                         r"forward\(tokens \(4, 16\), targets\) .*" + message):
        trainer.fit()
    assert trainer.step == 0 and not trainer.history.step


def test_1d_a_plugin_with_t_minus_1_logits_exits_2_naming_it(tmp_path, capsys, forget):
    path = _plugin(tmp_path, "short_plugin", """
        class ShortLM(DenseLM):
            def forward(self, tokens, targets=None):
                out = super().forward(tokens, targets)
                out.logits = out.logits[:, :-1]
                return out

        register_mechanism(Mechanism(name="short_r3", model=ShortLM, summary="T-1 logits"))
    """)
    forget.append("short_r3")
    assert train_main(["--plugin", str(path), "--preset", "tiny", "--steps", "2", "--arch",
                       "short_r3", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "mechanism 'short_r3' (ShortLM) breaks the LanguageModel contract" in err
    assert "logits of shape (4, 31, 256): expected (4, 32, 256)" in err
    assert not (tmp_path / "out" / "checkpoint.pt").exists()


def test_1d_a_model_that_keeps_the_contract_trains_on():
    cfg = _cfg()
    history = Trainer(build_model(cfg), cfg, _data(), callbacks=[]).fit()
    assert history.step == [1, 2]


# --- 2. a checkpoint whose weights are not finite ------------------------------------------------

@pytest.mark.parametrize("value, counts", [(float("nan"), "holds 1 NaN and 0 inf"),
                                           (float("inf"), "holds 0 NaN and 1 inf")])
def test_2_a_non_finite_checkpoint_is_refused_naming_file_and_tensor(tmp_path, capsys, value,
                                                                     counts):
    assert train_main(["--preset", "tiny", "--steps", "1", "--out", str(tmp_path / "good")]) == 0
    ckpt = torch.load(tmp_path / "good" / "checkpoint.pt", weights_only=True)
    name = sorted(k for k, t in ckpt["model"].items() if t.is_floating_point())[2]
    ckpt["model"][name].view(-1)[0] = value
    bad = tmp_path / "bad" / "checkpoint.pt"
    bad.parent.mkdir()
    torch.save(ckpt, bad)
    message = (rf"checkpoint {bad} is not usable: its weights are not finite \(tensor "
               rf"'{name}' {counts} values; 1 of \d+ tensors")
    with pytest.raises(CheckpointError, match=message):
        load_model(bad)
    with pytest.raises(CheckpointError, match=message):
        Trainer.from_checkpoint(bad, _data(), callbacks=[])
    cfg = _cfg(tmp_path / "other")
    with pytest.raises(CheckpointError, match=message):
        Trainer(build_model(cfg), cfg, _data(), callbacks=[]).load_checkpoint(bad)
    assert train_main(["--preset", "tiny", "--steps", "3", "--out", str(bad.parent),
                       "--resume"]) == 2
    err = capsys.readouterr().err
    assert "weights are not finite" in err and name in err and "Traceback" not in err
    assert str(bad) in err


# --- 3. one architecture's checkpoint into another -----------------------------------------------

def test_3_another_arch_is_refused_naming_both_archs(tmp_path):
    path = _checkpoint(tmp_path / "dense")
    bcmt = build_model(_cfg(arch="bcmt"))
    with pytest.raises(CheckpointError, match=rf"checkpoint {path} holds a 'dense' model, not a "
                                              r"'bcmt' \(BCMTLM\) one: its weights do not fit\. "
                                              r"Resume with a 'dense' model \(model=None"):
        Trainer.from_checkpoint(path, _data(), callbacks=[], model=bcmt,
                                checkpoint_dir=str(tmp_path / "bcmt"))
    cfg = _cfg(tmp_path / "bcmt2", arch="bcmt")
    trainer = Trainer(build_model(cfg), cfg, _data(), callbacks=[])
    with pytest.raises(CheckpointError, match=r"the checkpoint holds a 'dense' model, not a "
                                              r"'bcmt' \(BCMTLM\) one"):
        trainer.restore(torch.load(path, weights_only=True))
    with pytest.raises(CheckpointError, match=rf"checkpoint {path} holds a 'dense' model, not"):
        trainer.load_checkpoint(path)


def test_3_other_sizes_name_the_settings_that_differ(tmp_path):
    path = _checkpoint(tmp_path / "small")
    wide = build_model(_cfg(d_model=64))
    with pytest.raises(CheckpointError, match=r"holds a 'dense' model with other settings than "
                                              r"this one: d_model=32 \(checkpoint\) vs 64 \(this "
                                              r"model\)"):
        Trainer.from_checkpoint(path, _data(), callbacks=[], model=wide,
                                checkpoint_dir=str(tmp_path / "wide"))


def test_3_weights_missing_a_tensor_are_named(tmp_path):
    path = _checkpoint(tmp_path / "dense")
    ckpt = torch.load(path, weights_only=True)
    name = sorted(ckpt["model"])[0]
    del ckpt["model"][name]                                 # one tensor fewer than the model has
    bad = tmp_path / "mixed" / "checkpoint.pt"
    bad.parent.mkdir()
    torch.save(ckpt, bad)
    with pytest.raises(CheckpointError, match=rf"checkpoint {bad} holds a 'dense' model whose "
                                              r"weights do not fit this 'dense' \(DenseLM\) "
                                              rf"\(1 tensors missing, extra or of another shape, "
                                              rf"e\.g\. \['{name}'\]\)"):
        load_model(bad)


def test_3_a_hand_built_model_without_a_config_is_named_too(tmp_path):
    cfg = _cfg(tmp_path / "hand").train
    path = _checkpoint(tmp_path / "dense")
    ckpt = torch.load(path, weights_only=True)
    del ckpt["run_config"]
    with pytest.raises(CheckpointError, match=r"the checkpoint holds another model \(it stores "
                                              r"no model config\) whose weights do not fit this "
                                              r"Linear"):
        Trainer(torch.nn.Linear(4, 4), cfg, _data(), callbacks=[]).restore(ckpt)


# --- 4. a model factory that returns no model, a model whose forward exits -----------------------

def test_4_a_factory_that_returns_no_model_is_refused_naming_the_arch(tmp_path, capsys, forget):
    path = _plugin(tmp_path, "str_factory", """
        register_mechanism(Mechanism(name="str_r4", model=lambda cfg: "not a model", summary="x"))
    """)
    forget.append("str_r4")
    load_plugin(path)
    with pytest.raises(ValueError, match=r"arch='str_r4': its model\(cfg\) returned str 'not a "
                                         r"model': expected a LanguageModel"):
        build_model(preset("tiny", arch="str_r4"))
    assert train_main(["--plugin", str(path), "--preset", "tiny", "--arch", "str_r4",
                       "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: arch='str_r4'") and "returned str" in err
    assert "Traceback" not in err and "num_params" not in err


def _exiting(folder: Path, arch: str, after: int) -> Path:
    """A plugin whose model calls sys.exit(4) in its training step number ``after + 1`` (a batch
    of the tiny preset's 4 rows: the memory estimate's dry runs before them take fewer)."""
    return _plugin(folder, f"exits_{arch}", f"""
        import sys

        class ExitLM(DenseLM):
            def forward(self, tokens, targets=None):
                self.calls = getattr(self, "calls", 0) + (self.training and len(tokens) == 4)
                if self.calls > {after}:
                    sys.exit(4)
                return super().forward(tokens, targets)

        register_mechanism(Mechanism(name={arch!r}, model=ExitLM, summary="exits"))
    """)


def test_4_sys_exit_in_a_model_forward_is_named(tmp_path, forget):
    load_plugin(_exiting(tmp_path, "exit_r4", after=0))
    forget.append("exit_r4")
    model = build_model(preset("tiny", arch="exit_r4"))
    with pytest.raises(RuntimeError, match=r"the model 'exit_r4' \(ExitLM\) called sys\.exit\(4\) "
                                           r"in its forward"):
        model(torch.zeros(4, 8, dtype=torch.long))


def test_4_sys_exit_in_the_first_step_ends_train_with_one_line(tmp_path, capsys, forget):
    path = _exiting(tmp_path, "exit_first_r4", after=0)
    forget.append("exit_first_r4")
    status = train_main(["--plugin", str(path), "--preset", "tiny", "--steps", "2", "--arch",
                         "exit_first_r4", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith("error: the model 'exit_first_r4' (ExitLM) called sys.exit(4) in its "
                          "forward") and "Traceback" not in err
    assert not (tmp_path / "out" / "checkpoint.pt").exists()       # nothing trained to keep


def test_4_sys_exit_after_some_steps_keeps_what_was_trained(tmp_path, capsys, forget):
    path = _exiting(tmp_path, "exit_later_r4", after=2)
    forget.append("exit_later_r4")
    status = train_main(["--plugin", str(path), "--preset", "tiny", "--steps", "4", "--arch",
                         "exit_later_r4", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 1 and "called sys.exit(4) in its forward" in err
    ckpt = torch.load(tmp_path / "out" / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == 2 and (tmp_path / "out" / "history.json").is_file()


@pytest.mark.parametrize("command", [
    ["bench", "--seq-len", "32", "--d-model", "32", "--n-layer", "1", "--n-head", "2",
     "--warmup", "0", "--repeats", "1", "--memory", "none", "--phases", "train"],
    ["reproduce", "--preset", "tiny", "--steps", "2"],
])
def test_4_sys_exit_in_a_model_forward_ends_bench_and_reproduce_with_one_line(
        command, tmp_path, capsys, monkeypatch, forget):
    path = _exiting(tmp_path, "exit_cmd_r4", after=-1)                   # every forward exits
    forget.append("exit_cmd_r4")
    monkeypatch.chdir(tmp_path)
    out = ["--out", str(tmp_path / "out")] if command[0] == "reproduce" else []
    assert main([*command, "--plugin", str(path), "--arch", "exit_cmd_r4", *out]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == ("error: the model 'exit_cmd_r4' (ExitLM) called sys.exit(4) "
                                    "in its forward: a model must raise an exception, not exit")
    assert "Traceback" not in err
