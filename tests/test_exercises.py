"""Exercise builder: stubs, markers, drift check, strip; the repo's exercises are current and
every check cell of every exercise notebook fails on the student stubs (checks have teeth)."""

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from blockmem_lite.tools import exercises
from blockmem_lite.tools.exercises import (
    ExerciseError,
    build,
    drift,
    exercises_dir,
    make_exercise,
    read_notebook,
    solutions_dir,
    stub_code,
)

SOLUTION = '''import torch

def scores(q, k):
    """(T, d) x (T, d) -> (T, T)."""
    ### BEGIN SOLUTION
    # HINT: scale by sqrt(d)
    s = q @ k.T
    return s / q.shape[-1] ** 0.5
    ### END SOLUTION
'''


def _check_cell(source: str):
    return new_code_cell(source, metadata={"tags": ["check"]})


def _solution_notebook():
    executed = new_code_cell(SOLUTION, execution_count=3,
                             outputs=[new_output("stream", name="stdout", text="hi\n")])
    top_level = new_code_cell("x = 2\n### BEGIN SOLUTION\ny = x * 21\n### END SOLUTION\nprint(y)")
    return new_notebook(cells=[
        new_markdown_cell("# Scores\nWhy scale?\n<!-- BEGIN SOLUTION -->\nSoftmax saturates."
                          "\n<!-- END SOLUTION -->"),
        executed,
        _check_cell("from blockmem_lite.checks import check_close\n"
                    "import torch\nq = torch.eye(4)\ncheck_close(scores(q, q), q / 2, 'scores')"),
        top_level,
        _check_cell("from blockmem_lite.checks import check_equal\ncheck_equal(y, 42, 'y')"),
    ])


def _write(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


# --- the student version ----------------------------------------------------------------------


def test_stub_replaces_the_solution_keeping_indentation_and_hint():
    student = stub_code(SOLUTION)
    assert "q @ k.T" not in student and "### BEGIN SOLUTION" not in student
    assert '    # HINT: scale by sqrt(d)\n    raise NotImplementedError("Exercise: replace this line' \
        in student
    assert student.count("scale by sqrt(d)") == 1, "the hint is shown once, as a comment"
    assert student.startswith('import torch\n\ndef scores(q, k):\n    """(T, d)')
    namespace = {}
    exec(compile(student, "student", "exec"), namespace)
    with pytest.raises(NotImplementedError, match="Exercise: replace this line with your code"):
        namespace["scores"](None, None)


def test_stub_without_hint_gets_a_generic_message_and_keeps_code_around_it():
    student = stub_code("a = 1\n### BEGIN SOLUTION\nb = 2\n### END SOLUTION\nprint(a)")
    assert student == ('a = 1\nraise NotImplementedError("Exercise: '
                       f'{exercises.GENERIC_HINT}")\nprint(a)')


def test_exercise_clears_outputs_replaces_markdown_and_keeps_the_solution_intact():
    solution = _solution_notebook()
    student = make_exercise(solution, "01_scores.ipynb")
    code = [c for c in student.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert student.cells[0].source == "# Scores\nWhy scale?\n*Your answer here.*"
    assert "y = x * 21" not in student.cells[3].source
    assert exercises.check_cell_indices(student) == [2, 4]
    assert [c.id for c in student.cells] == [c.id for c in solution.cells]
    assert solution.cells[1].outputs and "q @ k.T" in solution.cells[1].source  # input unchanged
    assert student.metadata["blockmem_lite"]["generated_from"] == "solutions/01_scores.ipynb"
    goes_on = [i for i, c in enumerate(student.cells)
               if exercises.GOES_ON_TAG in c.metadata.get("tags", [])]
    stubbed = [i for i, c in enumerate(student.cells) if "NotImplementedError" in c.source]
    assert goes_on == sorted(set(stubbed) | {2, 4}), "stub and check cells let Run All go on"
    assert not any(exercises.GOES_ON_TAG in c.metadata.get("tags", []) for c in solution.cells)


@pytest.mark.parametrize("source, problem", [
    ("### BEGIN SOLUTION\nx = 1", "line 1 is never closed"),
    ("x = 1\n### END SOLUTION", "line 2 has no '### BEGIN SOLUTION'"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n### END SOLUTION",
     "nested '### BEGIN SOLUTION' on line 2"),
    ("## BEGIN SOLUTION\nx = 1\n### END SOLUTION", "looks like a solution marker"),
])
def test_bad_markers_name_the_notebook_and_cell(source, problem):
    nb = new_notebook(cells=[new_markdown_cell("intro"), new_code_cell(source)])
    with pytest.raises(ExerciseError, match="02_bad.ipynb, cell 1") as err:
        make_exercise(nb, "02_bad.ipynb")
    assert problem in str(err.value)


def test_unbalanced_markdown_marker_is_an_error():
    nb = new_notebook(cells=[new_markdown_cell("<!-- BEGIN SOLUTION -->\nanswer")])
    with pytest.raises(ExerciseError, match="cell 0: '<!-- BEGIN SOLUTION -->' on line 1"):
        make_exercise(nb, "03.ipynb")


# --- build / check / strip --------------------------------------------------------------------


@pytest.fixture
def folders(tmp_path):
    solutions, out = tmp_path / "solutions", tmp_path / "exercises"
    _write(_solution_notebook(), solutions / "01_scores.ipynb")
    return solutions, out


def _cli(*argv) -> int:
    return exercises.main([str(a) for a in argv])


def test_build_writes_and_check_detects_drift(folders, capsys):
    solutions, out = folders
    assert _cli("check", "--solutions", solutions, "--out", out) == 1
    assert "missing:" in capsys.readouterr().err
    assert _cli("build", "--solutions", solutions, "--out", out) == 0
    assert "new" in capsys.readouterr().out
    written = (out / "01_scores.ipynb").read_bytes()
    assert _cli("check", "--solutions", solutions, "--out", out) == 0

    _cli("build", "--solutions", solutions, "--out", out)
    assert "unchanged" in capsys.readouterr().out
    assert (out / "01_scores.ipynb").read_bytes() == written  # builds are deterministic

    solution = read_notebook(solutions / "01_scores.ipynb")
    solution.cells[1].source = solution.cells[1].source.replace("# HINT: scale", "# HINT: divide")
    _write(solution, solutions / "01_scores.ipynb")
    capsys.readouterr()
    assert _cli("check", "--solutions", solutions, "--out", out) == 1
    err = capsys.readouterr().err
    assert "out of date:" in err and "01_scores.ipynb" in err and "exercises build" in err
    _cli("build", "--solutions", solutions, "--out", out)
    assert drift(solutions, out) == []


def test_check_ignores_json_formatting_and_reports_extra_files(folders, capsys):
    solutions, out = folders
    build(solutions, out)
    target = out / "01_scores.ipynb"
    target.write_text(target.read_text().replace("\n", "\n  "))  # whitespace only
    assert drift(solutions, out) == []
    _write(make_exercise(_solution_notebook(), "09_stray.ipynb"), out / "09_stray.ipynb")
    assert drift(solutions, out) == [f"extra (no solution notebook): {out / '09_stray.ipynb'}"]
    build(solutions, out, prune=True)
    assert not (out / "09_stray.ipynb").exists() and drift(solutions, out) == []


def test_missing_solutions_folder_is_a_clear_error(tmp_path, capsys):
    assert _cli("build", "--solutions", tmp_path / "nope", "--out", tmp_path / "x") == 2
    assert "solutions folder" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_cells_without_ids_get_deterministic_ids(folders):
    solutions, out = folders
    path = solutions / "01_scores.ipynb"
    path.write_text(path.read_text().replace('"id": ', '"old_id": '))
    raw = path.read_text()
    assert '"id"' not in raw
    first, second = make_exercise(read_notebook(path)), make_exercise(read_notebook(path))
    assert [c.id for c in first.cells] == [c.id for c in second.cells] == \
        [f"cell-{i}" for i in range(5)]


def test_strip_clears_outputs_recursively_and_skips_checkpoints(tmp_path, capsys):
    dirty = _solution_notebook()
    dirty.metadata["widgets"] = {"state": {}}
    nested = _write(dirty, tmp_path / "a" / "b" / "01_x.ipynb")
    checkpoint = _write(dirty, tmp_path / "a" / ".ipynb_checkpoints" / "01_x-checkpoint.ipynb")
    assert _cli("strip", tmp_path / "a") == 0
    assert "1 notebook(s) stripped" in capsys.readouterr().out
    clean = read_notebook(nested)
    assert "widgets" not in clean.metadata
    assert all(c.outputs == [] and c.execution_count is None
               for c in clean.cells if c.cell_type == "code")
    assert "q @ k.T" in clean.cells[1].source
    assert read_notebook(checkpoint).cells[1].outputs
    assert _cli("strip", nested) == 0 and "0 notebook(s)" in capsys.readouterr().out
    assert _cli("strip", tmp_path / "missing.ipynb") == 2


# --- the repository's notebooks ---------------------------------------------------------------


def _names(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("*.ipynb")} if folder.is_dir() else set()


def test_repo_exercises_are_up_to_date():
    assert drift() == [], "run `python -m blockmem_lite exercises build`"


def test_solutions_and_exercises_hold_the_same_notebooks():
    assert _names(solutions_dir()) == _names(exercises_dir())


def _execute(path: Path, monkeypatch):
    """Run a notebook headless in fast mode, errors allowed; returns the executed node."""
    from nbclient import NotebookClient

    for key, value in {"BLOCKMEM_FAST": "1", "BLOCKMEM_HEADLESS": "1", "PLOTLY_RENDERER": "json",
                       "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items():
        monkeypatch.setenv(key, value)
    nb = read_notebook(path)
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


def _teeth_report(nb) -> list[str]:
    """Problems: check cells that did not fail, and errors before the first exercise stub."""
    errors = {i for i, c in enumerate(nb.cells) if c.cell_type == "code"
              and any(o.output_type == "error" for o in c.outputs)}
    stubs = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and 'NotImplementedError("Exercise:' in c.source]
    checks = exercises.check_cell_indices(nb)
    problems = [f"check cell {i} did not fail on the stubs: its check has no teeth"
                for i in checks if i not in errors]
    first_stub = stubs[0] if stubs else len(nb.cells)
    problems += [f"cell {i} failed before the first exercise (cell {first_stub}): the notebook "
                 "is broken, not the exercise" for i in sorted(errors) if i < first_stub]
    if not checks:
        problems.append("no code cell is tagged 'check'")
    return problems


def test_teeth_harness_catches_a_check_that_passes(tmp_path, monkeypatch):
    nb = make_exercise(_solution_notebook(), "01_scores.ipynb")
    nb.cells.append(_check_cell("from blockmem_lite.checks import check_true\n"
                                "check_true(1 + 1 == 2, 'arithmetic')"))
    executed = _execute(_write(nb, tmp_path / "01_scores.ipynb"), monkeypatch)
    assert _teeth_report(executed) == ["check cell 5 did not fail on the stubs: its check has no "
                                       "teeth"]
    error = next(o for o in executed.cells[2].outputs if o.output_type == "error")
    assert error.ename == "NotImplementedError"


EXERCISE_NAMES = sorted(_names(solutions_dir()) | _names(exercises_dir()))


@pytest.mark.parametrize("name", EXERCISE_NAMES, ids=[n.removesuffix(".ipynb")
                                                       for n in EXERCISE_NAMES])
def test_every_check_cell_fails_on_the_student_stub(name, monkeypatch, request):
    if name.startswith("10_"):
        request.getfixturevalue("fast_reproduce")      # the lab run notebook 10 reads
    path = exercises_dir() / name
    assert path.exists(), f"{name} has no exercise notebook: run `python -m blockmem_lite " \
                          "exercises build`"
    problems = _teeth_report(_execute(path, monkeypatch))
    assert problems == [], f"{name}: " + "; ".join(problems)


# --- the answer is not given away --------------------------------------------------------------

MIN_ANSWER_LINE = 15    # shorter lines ("return w", "y = x + h") are words, not the answer


def _squeeze(text: str) -> str:
    return "".join(text.split())


def answer_lines(source: str) -> list[list[str]]:
    """Per solution region of a cell: its code lines (comments dropped), whitespace removed."""
    regions, current = [], None
    for line in source.split("\n"):
        if line.strip() == exercises.BEGIN:
            current = []
        elif line.strip() == exercises.END and current is not None:
            regions.append(current)
            current = None
        elif current is not None:
            code = _squeeze(line.split("#", 1)[0]) if not line.lstrip().startswith("#") else ""
            if code:
                current.append(code)
    return regions


def giveaways(solution, elsewhere: dict[str, str]) -> list[str]:
    """Where a notebook gives an answer away: a HINT holding a line of its answer, or two
    consecutive answer lines standing verbatim in ``elsewhere`` ({where: text})."""
    found, squeezed = [], {where: _squeeze(text) for where, text in elsewhere.items()}
    for i, cell in enumerate(solution.cells):
        if cell.cell_type != "code":
            continue
        hints = _squeeze(" ".join(m.group("text") for m in map(exercises._HINT.match,
                                                                cell.source.split("\n")) if m))
        for region in answer_lines(cell.source):
            long_lines = [line for line in region if len(line) >= MIN_ANSWER_LINE]
            found += [f"cell {i}: its HINT holds the answer line {line!r}"
                      for line in long_lines if line in hints]
            for a, b in zip(region, region[1:], strict=False):
                if len(a + b) < 2 * MIN_ANSWER_LINE:
                    continue
                found += [f"cell {i}: the answer lines {a!r} / {b!r} stand in {where}"
                          for where, text in squeezed.items() if a + b in text]
    return found


def _outside_the_answers(nb, label: str) -> dict[str, str]:
    """Every cell's text but the solution regions: what a student sees."""
    texts = {}
    for i, cell in enumerate(nb.cells):
        source = stub_code(cell.source) if cell.cell_type == "code" else cell.source
        texts[f"{label} cell {i}"] = source
    return texts


@pytest.mark.parametrize("name", sorted(_names(solutions_dir())))
def test_hints_and_notebooks_do_not_give_the_answer(name):
    """A hint guides (a question, a shape, a property); it is not the answer's code. The answer
    does not stand in the teaching notebook or elsewhere in the exercise notebook either."""
    solution = read_notebook(solutions_dir() / name)
    elsewhere = _outside_the_answers(solution, "the exercise notebook")
    teaching = exercises.notebooks_dir() / name
    if teaching.exists():
        elsewhere |= _outside_the_answers(read_notebook(teaching), f"notebooks/{name}")
    assert giveaways(solution, elsewhere) == []


def test_giveaways_are_found():
    nb = new_notebook(cells=[new_code_cell(
        "def decay(n, a):\n    ### BEGIN SOLUTION\n    # HINT: lag = (i - j).clamp(min=0)\n"
        "    lag = (i - j).clamp(min=0)\n    w = a ** lag * (j <= i)\n    ### END SOLUTION")])
    teaching = {"notebook 02 cell 3": "lag = (i - j).clamp(min=0)\nw = a ** lag * (j <= i)\n"}
    found = giveaways(nb, teaching)
    assert found == ["cell 0: its HINT holds the answer line 'lag=(i-j).clamp(min=0)'",
                     "cell 0: the answer lines 'lag=(i-j).clamp(min=0)' / 'w=a**lag*(j<=i)' "
                     "stand in notebook 02 cell 3"]
    assert giveaways(nb, {"other": "w = a ** lag"}) == found[:1]
