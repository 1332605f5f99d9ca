"""``review.md`` of ``exercises grade``: each student's answers, for a teacher to read.

Per student and exercise (a solution cell holding a ``### BEGIN SOLUTION`` region): the code
of the student's cell with the same id, in a fence no text of theirs can close, and a flag
(found with ``ast``) for each construct worth a look, as ``HEADER`` lists them. A flag asks
for a read, it is no verdict; the solutions' own answers raise none (a test proves it).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from blockmem_lite.tools.exercises import BEGIN, read_notebook, solutions_dir, stub_code
from blockmem_lite.tools.grade_report import (
    Row,
    _md_cell,
    refusal,
    replace_whole,
    shorten,
    visible,
)

KIT = "blockmem_lite"
RISKY = ("importlib", "marshal", "gc", "inspect", "ctypes", "threading", "concurrent.futures",
         "multiprocessing", "subprocess", "builtins", "os.system", "os.popen", "sys.meta_path",
         "sys.modules", "sys._getframe")
RUNS_TEXT = {"eval", "exec", "compile", "__import__", "get_ipython"}
INTERNALS = {"__code__", "__globals__", "__builtins__", "FunctionType", "CodeType", "__file__",
             "__spec__", "__loader__"}
ATTRS = {"getattr", "setattr", "delattr"}
# roots whose attributes an answer must not assign, beside every imported name
GUARDED = {"torch", "np", "F", "nn", "builtins", "__builtins__", "get_ipython", "IPython", KIT,
           *sys.stdlib_module_names}
CODE_CHARS = 20_000     # the most characters of an answer shown; the notebook keeps the rest


def python(source: str) -> str:
    """The cell as Python: IPython lines (``%magic``, ``!shell``) become ``pass`` at their
    indent, so the line numbers stay."""
    return "\n".join(line[:len(line) - len(line.lstrip())] + "pass"
                     if line.lstrip().startswith(("%", "!")) else line
                     for line in source.split("\n"))


def _parse(source: str) -> ast.AST | None:
    try:
        return ast.parse(python(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def imports(sources) -> dict[str, str]:
    """Name -> the dotted thing it was imported as, over the cells ``sources``."""
    names = {}
    for tree in filter(None, map(_parse, sources)):
        for node in ast.walk(tree):
            for alias, bound, _ in _imported(node):
                names[alias] = bound
    return names


def _imported(node) -> list[tuple[str, str, str]]:
    """(name bound, what it is bound to, what is imported) for each name an import binds."""
    if isinstance(node, ast.Import):
        return [(a.asname or a.name.split(".")[0], a.name if a.asname else a.name.split(".")[0],
                 a.name) for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [(a.asname or a.name, *[f"{node.module}.{a.name}"] * 2) for a in node.names]
    return []


def _dotted(node, names: dict[str, str]) -> str:
    """``a.b.c`` with ``a`` resolved through ``names``; a call shows as ``f()``."""
    parts = []
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
        elif isinstance(node, ast.Call):
            parts.append("()")
        node = node.func if isinstance(node, ast.Call) else node.value
    root = names.get(node.id, node.id) if isinstance(node, ast.Name) else "…"
    return ".".join([root, *reversed(parts)]).replace(".()", "()")


def _kit_refs(tree, names: dict[str, str]) -> dict[str, int]:
    """The kit things a cell names (its imports, its outermost ``a.b`` chains), each with the
    line it first appears on."""
    refs, chains = {}, _chains(tree)
    for node in ast.walk(tree):
        for ref in [full for *_, full in _imported(node)] + \
                ([_dotted(node, names)] if node in chains else []):
            if ref == KIT or ref.startswith(KIT + "."):
                refs.setdefault(ref, node.lineno)
    return refs


def _chains(tree) -> set[ast.AST]:
    """The names and ``a.b`` chains of ``tree`` that are not part of a longer chain."""
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    return {n for n in ast.walk(tree)
            if isinstance(n, (ast.Attribute, ast.Name)) and id(n) not in inner}


def _root(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _risky(dotted: str) -> bool:
    return any(dotted == r or dotted.startswith(r + ".") for r in RISKY)


def flag(answer: str, solution: str = "", notebook=()) -> list[str]:
    """What in ``answer`` deserves a look, one ``line N: ...`` each; ``solution`` is the
    exercise's solution cell, ``notebook`` the other cells (for what they import)."""
    tree, key = _parse(answer), _parse(solution) or ast.Module([], [])
    if tree is None:
        return ["not checked: the code cannot be parsed (a syntax error or an IPython line)"]
    names = {**imports(notebook), **imports([answer])}
    allowed = _kit_refs(key, {**imports(notebook), **imports([solution])})
    pieces = {n.name.removeprefix("my_") for n in ast.walk(key)
              if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    found = [(n, f"IPython line: {line.strip()[:40]}")
             for n, line in enumerate(answer.split("\n"), 1) if line.lstrip()[:1] in ("%", "!")]
    for node in ast.walk(tree):
        found += [(node.lineno, text) for text in _node_flags(node, names)]
    found += [(n, f"uses {dotted}") for node in _chains(tree)
              if _risky(dotted := _dotted(node, names)) for n in [node.lineno]]
    for ref, line in _kit_refs(tree, names).items():
        if ref not in allowed:
            found.append((line, f"uses {ref} (" + ("the piece this exercise asks for"
                          if ref.split(".")[-1] in pieces else "kit code the solution does "
                          "not use") + ")"))
    return [f"line {n}: {text}" for n, text in sorted(dict.fromkeys(found))]


def _node_flags(node, names: dict[str, str]) -> list[str]:
    """The flags of one node (its children are flagged on their own)."""
    out = [f"imports {full}" for *_, full in _imported(node) if _risky(full)]
    if isinstance(node, ast.Name) and node.id in RUNS_TEXT | INTERNALS:
        out.append(f"uses {node.id}")
    if isinstance(node, ast.Attribute) and node.attr in INTERNALS:
        out.append(f"uses .{node.attr}")
    roots = GUARDED | set(names)
    targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
        [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTRS:
        name = node.args[1] if len(node.args) > 1 else None
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            out.append(f"{node.func.id} with a computed name")
        if node.func.id != "getattr" and node.args and _root(node.args[0]) in roots:
            out.append(f"{node.func.id} on {_dotted(node.args[0], names)}")
    for target in _unpacked(targets):
        if isinstance(target, (ast.Attribute, ast.Subscript)) and _root(target) in roots:
            out.append(f"changes {_dotted(target, names)}")
    return out


def _unpacked(targets) -> list[ast.AST]:
    """Assignment targets with tuples, lists and starred ones opened."""
    out = []
    for t in targets:
        t = t.value if isinstance(t, ast.Starred) else t
        out += _unpacked(t.elts) if isinstance(t, (ast.Tuple, ast.List)) else [t]
    return out


# --- the sheet -----------------------------------------------------------------------------------

HEADER = """# Review sheet: the answers to read

For reading, not a verdict: no flag changes a score, and the solutions' own answers raise
none. Each answer is the student's cell with the id of a solution cell, as written; each
flag marks a line worth a look: kit code the solution does not use (the exercise's own
piece named), names built at run time, eval, exec, compile, importlib, modules that reach
into the interpreter or run work elsewhere (marshal, gc, inspect, ctypes, threading,
multiprocessing, subprocess, ...), code objects and globals, IPython lines, and assignments
to attributes of the kit, torch, builtins, IPython or another module.
"""


def exercises_of(nb) -> list[tuple[str, str, str]]:
    """(cell id, title, source) of each solution cell holding a ``### BEGIN SOLUTION``."""
    out, title = [], ""
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("#"):
            title = cell.source.lstrip().split("\n")[0].lstrip("#").strip()
        if cell.cell_type == "code" and BEGIN in map(str.strip, cell.source.split("\n")):
            out.append((cell.get("id", ""), title, cell.source))
    return out


def fenced(source: str) -> list[str]:
    """``source`` as a fenced code block that no line of it can close (the fence is longer
    than any run of backticks in it), control characters escaped."""
    text = shorten(source, CODE_CHARS)
    fence = "`" * max(3, 1 + max(map(len, re.findall("`+", text)), default=0))
    return [fence + "python", *(visible(line.expandtabs(4)) for line in text.split("\n")),
            fence]


def notebook_review(path: Path, key, root: Path) -> list[str]:
    """The review of one student's notebook ``path`` against the solution notebook ``key``."""
    if refusal(path, root):
        return ["Not read: refused (see grades.md).", ""]
    try:
        nb = read_notebook(path)
    except Exception as err:  # not JSON, not a notebook, unreadable: grades.md says more
        return [f"Not read: {_md_cell(type(err).__name__)}.", ""]
    cells = {c.get("id"): c for c in nb.cells if c.cell_type == "code"}
    others = [c.source for c in [*nb.cells, *key.cells] if c.cell_type == "code"]
    out = []
    for cell_id, title, source in exercises_of(key):
        out += [f"#### {_md_cell(title or cell_id)} (cell {_md_cell(cell_id)})", ""]
        mine = cells.get(cell_id)
        if mine is None or mine.source.strip() == stub_code(source).strip():
            out += ["Not answered" + (" (no cell with this id)." if mine is None else
                                      " (the stub as handed out)."), ""]
            continue
        out += [f"- {_md_cell(note)}" for note in flag(mine.source, source, others)] or \
            ["No flags."]
        out += ["", *fenced(mine.source), ""]
    return out


def review(rows: list[Row], submissions: Path, solutions: Path | None = None) -> str:
    """The review sheet of the notebooks graded in ``rows``, student by student."""
    folder, keys, out, shown = Path(solutions or solutions_dir()), {}, [HEADER], None
    for student, name, file in dict.fromkeys((r.student, r.notebook, r.file)
                                             for r in rows if r.notebook and r.file):
        if student != shown:
            out += [f"## {_md_cell(student)}", ""]
            shown = student
        if name not in keys:
            keys[name] = read_notebook(folder / f"{name}.ipynb")
        out += [f"### {_md_cell(name)} ({_md_cell(file)})", ""]
        out += notebook_review(Path(submissions) / student / file, keys[name],
                               Path(submissions))
    return "\n".join(out) + "\n"


def write_review(rows: list[Row], submissions: Path, out: Path,
                 solutions: Path | None = None) -> Path:
    """Write ``review.md`` into ``out`` (replaced whole); return its path."""
    path = Path(out) / "review.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_whole(path, review(rows, submissions, solutions))
    return path
