"""Every reference in the notebooks, the README, docs/ and the shipped lab reports resolves.

Scanned: ``notebooks/{,exercises/,solutions/}*.ipynb`` (markdown cells and code-cell
comments), ``README.md``, ``docs/*.md`` and ``data/reproduce/*/report.md``. A problem is:

* a relative markdown link ``[..](target)`` (or ``<a href>`` / ``<img src>``) whose file
  does not exist, resolved from the file that holds it, or whose ``#anchor`` is not a
  heading of the target (GitHub's slug rules; a notebook's markdown headings);
* a bare file reference in prose (``docs/X.md``, ``blockmem_lite/x/y.py``,
  ``tests/test_z.py``, an all-caps ``X.md``) that is no file of the repository, tried
  from the repository root and from the file's folder;
* a path that leaves the repository (``../shared``, ``/work/...``, absolute paths);
* a mention of one of the project's internal design files, which are not shipped
  (``DESIGN_FILES``), unless the repository holds a file of that name.

The library (``blockmem_lite/**/*.py``) and the tests (``tests/*.py``) are scanned for the
design-file names too. http(s) and mailto links are not checked. The scanner's own tests
plant each kind of mistake in a temporary folder, so the repository test cannot pass by
finding nothing.
"""

from __future__ import annotations

import io
import json
import re
import tokenize
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
# Built from parts so this file does not mention them itself.
DESIGN_FILES = tuple(f"{name}.md" for name in ("MECHANISMS", "PERFORMANCE", "ARCHITECTURE",
                                                "NOTEBOOKS"))
SKIPPED_DIRS = {".git", ".venv", "build", "dist", "site", "runs", "__pycache__",
                ".ipynb_checkpoints", ".pytest_cache", ".ruff_cache"}

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)", re.M)
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']", re.I)
HTML_ANCHOR = re.compile(r"<a\b[^>]*?\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
URL = re.compile(r"\b(?:https?|mailto|ftp):[^\s)>\]`'\"]*", re.I)
BARE_PATH = re.compile(r"(?<![\w./~-])((?:\.\.?/)*(?:[\w.-]+/)+[\w.-]*\w\.(?:md|py|ipynb))(?![\w/])")
BARE_DOC = re.compile(r"(?<![\w./~-])([A-Z][A-Z0-9_]*\.md)(?![\w/])")
PARENT_PATH = re.compile(r"(?<![\w./-])((?:\.\./)+[\w.-]+(?:/[\w.-]+)*)")
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~)\]-])(/(?:work|home|tmp|usr|opt|root|mnt|Users)"
                           r"(?:/[\w.+-]+)+/?)")
# A placeholder in a pattern of names: NN (a notebook number), DIR / OUT (a folder).
PLACEHOLDER = re.compile(r"(?<![A-Z])NN(?![A-Z])|(?:^|/)(?:DIR|OUT)/")
PACKAGE = "blockmem_lite"
WRITTEN_ELSEWHERE = {"STUDENT_EDITION.md"}     # written by the kit into a release folder
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")


class Problem(NamedTuple):
    where: str      # file:line, or file:cell N line M
    reference: str
    why: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reference!r}: {self.why}"


# --- what is scanned ---------------------------------------------------------------------

class Text(NamedTuple):
    """One piece of a file to scan: ``prose`` gets every check, ``code`` only the
    design-file check. ``line`` is the number of the piece's first line."""
    path: Path
    label: str       # "" for a plain file, "cell N" in a notebook
    line: int
    body: str
    prose: bool


def code_comments(source: str) -> list[tuple[int, str]]:
    """(line index, comment text) of each comment of a code cell (0-based lines)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        return [(t.start[0] - 1, t.string) for t in tokens if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, IndentationError, SyntaxError):   # IPython magics and such
        return [(i, line[line.index("#"):]) for i, line in enumerate(source.splitlines())
                if line.lstrip().startswith("#")]


def notebook_texts(path: Path) -> list[Text]:
    """Each markdown cell as prose; each code cell's comments as prose and its whole
    source as code (design-file names in strings count too)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    texts = []
    for number, cell in enumerate(cells, 1):
        source = "".join(cell.get("source", ""))
        label = f"cell {number}"
        if cell.get("cell_type") == "markdown":
            texts.append(Text(path, label, 1, source, True))
        elif cell.get("cell_type") == "code":
            texts += [Text(path, label, i + 1, comment, True) for i, comment in
                      code_comments(source)]
            texts.append(Text(path, label, 1, source, False))
    return texts


def scanned_texts(root: Path) -> list[Text]:
    """Everything the repository test scans, in a fixed order."""
    texts = []
    for pattern in ("notebooks/*.ipynb", "notebooks/exercises/*.ipynb",
                    "notebooks/solutions/*.ipynb"):
        for path in sorted(root.glob(pattern)):
            texts += notebook_texts(path)
    for pattern in ("README.md", "docs/*.md", "data/reproduce/*/report.md"):
        texts += [Text(p, "", 1, p.read_text(encoding="utf-8"), True)
                  for p in sorted(root.glob(pattern))]
    for pattern in ("blockmem_lite/**/*.py", "tests/*.py"):
        texts += [Text(p, "", 1, p.read_text(encoding="utf-8"), False)
                  for p in sorted(root.glob(pattern)) if not SKIPPED_DIRS & set(p.parts)]
    return texts


# --- anchors -----------------------------------------------------------------------------

def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed
    (letters, digits, '-', '_' and spaces kept), each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)         # links: their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")               # tags, code marks
    text = re.sub(r"(\*\*|__|(?<!\w)[*_]|[*_](?!\w))", "", text)       # emphasis marks
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def headings(markdown: str) -> list[str]:
    """The ATX headings of a markdown text, outside fenced code blocks."""
    found, fenced = [], None
    for line in markdown.splitlines():
        fence = FENCE.match(line)
        if fence:
            fenced = None if fenced == fence.group(1) else fenced or fence.group(1)
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            found.append(match.group(2))
    return found


def slugs(titles: list[str]) -> set[str]:
    """GitHub's anchors for these headings in order: a repeated slug gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for title in titles:
        slug = github_slug(title)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    """The anchors a link may name in ``path``: its headings' slugs (for a notebook also
    Jupyter's own form, the heading with '-' for spaces) and explicit ``<a id>``."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        markdown = "\n".join("".join(c.get("source", "")) for c in cells
                             if c.get("cell_type") == "markdown")
        jupyter = {t.strip().replace(" ", "-") for t in headings(markdown)}
    else:
        markdown, jupyter = path.read_text(encoding="utf-8"), set()
    return frozenset(slugs(headings(markdown)) | jupyter | set(HTML_ANCHOR.findall(markdown)))


# --- the checks --------------------------------------------------------------------------

def inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def check_link(target: str, holder: Path, root: Path) -> str | None:
    """Why a markdown link target from ``holder`` is broken, or None."""
    target = target.strip("<>")
    if URL.match(target) or target.startswith("//"):
        return None
    file_part, _, anchor = target.partition("#")
    if file_part.startswith("/"):
        return "an absolute path: links must be relative"
    path = (holder.parent / file_part) if file_part else holder
    if not inside(path, root):
        return "leaves the repository"
    if not path.exists():
        return "no such file"
    if anchor and path.suffix in (".md", ".ipynb") and anchor not in anchors(path.resolve()):
        return f"no heading with anchor #{anchor} in {path.resolve().relative_to(root.resolve())}"
    return None


def without_links(text: str) -> str:
    """``text`` with link targets and URLs blanked out, each character a space so offsets
    stay put (bare references are what is left)."""
    def blank(match: re.Match, keep: int = 0) -> str:
        return match.group(0)[:keep] + " " * (len(match.group(0)) - keep)

    text = LINK.sub(lambda m: blank(m, m.group(0).index("](") + 1), text)
    for pattern in (REFERENCE_LINK, HTML_LINK, URL):
        text = pattern.sub(blank, text)
    return text


def check_bare(reference: str, holder: Path, root: Path) -> str | None:
    """Why a bare file reference names no file: tried from ``holder``'s folder and (unless
    it starts with ./ or ../) from the root and the package (``models/bcmt.py``). A
    pattern (``nbNN.py``, ``DIR/report.md``) names no one file and is not checked."""
    if PLACEHOLDER.search(reference) or reference in WRITTEN_ELSEWHERE:
        return None
    candidates = [holder.parent / reference]
    if not reference.startswith(("./", "../")):
        candidates += [root / reference, root / PACKAGE / reference]
    if not all(inside(c, root) for c in candidates):
        return "leaves the repository"
    return None if any(c.exists() for c in candidates) else "no such file in the repository"


def design_mentions(text: str, root: Path) -> list[tuple[int, str]]:
    """(offset, name) of each mention of an internal design file the repository does not
    hold."""
    return sorted((m.start(), name) for name in DESIGN_FILES if not repository_has(root, name)
                  for m in re.finditer(re.escape(name), text))


@lru_cache(maxsize=None)
def repository_has(root: Path, name: str) -> bool:
    """Whether some file of the repository (outside build outputs) is called ``name``."""
    return any(not SKIPPED_DIRS & set(p.relative_to(root).parts) for p in root.rglob(name))


def line_of(text: Text, offset: int) -> int:
    return text.line + text.body.count("\n", 0, offset)


def where(text: Text, root: Path, offset: int) -> str:
    name = text.path.relative_to(root).as_posix()
    line = line_of(text, offset)
    return f"{name}:{text.label} line {line}" if text.label else f"{name}:{line}"


def check_text(text: Text, root: Path) -> list[Problem]:
    """Every problem in one scanned piece."""
    problems = []
    for offset, name in design_mentions(text.body, root):
        problems.append(Problem(where(text, root, offset), name,
                                "an internal design file, not in the repository"))
    if not text.prose:
        return problems
    for match in LINK.finditer(text.body):
        why = check_link(match.group(1), text.path, root)
        if why:
            problems.append(Problem(where(text, root, match.start()), match.group(1), why))
    for match in [*REFERENCE_LINK.finditer(text.body), *HTML_LINK.finditer(text.body)]:
        why = check_link(match.group(1), text.path, root)
        if why:
            problems.append(Problem(where(text, root, match.start(1)), match.group(1), why))
    prose = without_links(text.body)
    for pattern in (BARE_PATH, BARE_DOC):
        for match in pattern.finditer(prose):
            why = check_bare(match.group(1), text.path, root)
            if why and match.group(1) not in DESIGN_FILES:
                problems.append(Problem(where(text, root, match.start(1)), match.group(1), why))
    for match in PARENT_PATH.finditer(prose):
        if BARE_PATH.fullmatch(match.group(1)):               # checked above
            continue
        if not inside(text.path.parent / match.group(1), root):
            problems.append(Problem(where(text, root, match.start(1)), match.group(1),
                                    "leaves the repository"))
    for match in ABSOLUTE_PATH.finditer(prose):
        problems.append(Problem(where(text, root, match.start(1)), match.group(1),
                                "an absolute path outside the repository"))
    return problems


def scan(root: Path) -> list[Problem]:
    """Every problem of the repository at ``root``."""
    anchors.cache_clear()
    repository_has.cache_clear()
    return [p for text in scanned_texts(root) for p in check_text(text, root)]


# --- the scanner's own tests: each planted mistake is found --------------------------------

def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, body in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
    return tmp_path


def _notebook(*cells: tuple[str, str]) -> str:
    return json.dumps({"cells": [{"cell_type": kind, "metadata": {}, "source": source}
                                 for kind, source in cells], "metadata": {},
                       "nbformat": 4, "nbformat_minor": 5})


GOOD_DOC = "# Guide\n\n## The FLOP model\n\n## Speed: 1.5x (CPU)\n\n## Speed: 1.5x (CPU)\n"


def test_github_slugs():
    assert github_slug("BCMT paper vs kit") == "bcmt-paper-vs-kit"
    assert github_slug("The comparison lab: `reproduce`") == "the-comparison-lab-reproduce"
    assert github_slug("Install without make (Windows, or by hand)") == \
        "install-without-make-windows-or-by-hand"
    assert github_slug("[Links](x.md) and **bold** text_name") == "links-and-bold-text_name"
    assert slugs(headings(GOOD_DOC)) == {"guide", "the-flop-model", "speed-15x-cpu",
                                         "speed-15x-cpu-1"}


def test_headings_in_code_fences_are_not_anchors():
    assert headings("# Real\n```bash\n# a comment\n```\n~~~\n## not\n~~~\n## Also real\n") \
        == ["Real", "Also real"]


def test_a_clean_tree_has_no_problems(tmp_path):
    root = _plant(tmp_path, {
        "README.md": "See [the guide](docs/GUIDE.md#the-flop-model), "
                     "[again](docs/GUIDE.md#speed-15x-cpu-1), [web](https://x.org/a.md), "
                     "`docs/GUIDE.md` and `tests/test_a.py`.\n",
        "docs/GUIDE.md": GOOD_DOC + "[back](../README.md) [here](#guide), GUIDE.md\n",
        "tests/test_a.py": "# the FLOP model: docs/GUIDE.md\n",
        "blockmem_lite/models/m.py": "",
        "notebooks/01_a.ipynb": _notebook(
            ("markdown", "# Notebook one\n[doc](../docs/GUIDE.md#the-flop-model)"),
            ("code", "x = 1  # see ../docs/GUIDE.md and models/m.py\n")),
        "notebooks/solutions/01_a.ipynb": _notebook(
            ("markdown", "[doc](../../docs/GUIDE.md) [nb](../01_a.ipynb#notebook-one)")),
    })
    assert scan(root) == []


def _problems(tmp_path: Path, files: dict[str, str]) -> list[Problem]:
    base = {"docs/GUIDE.md": GOOD_DOC, "README.md": "# Readme\n"}
    return scan(_plant(tmp_path, {**base, **files}))


def test_a_dead_link_is_found(tmp_path):
    [problem] = _problems(tmp_path, {"README.md": "[x](docs/GONE.md)\n"})
    assert problem.where == "README.md:1" and problem.why == "no such file"


def test_a_link_resolves_from_the_file_that_holds_it(tmp_path):
    [problem] = _problems(tmp_path, {"docs/OTHER.md": "[x](docs/GUIDE.md)\n"})
    assert problem.where == "docs/OTHER.md:1" and problem.reference == "docs/GUIDE.md"


def test_a_bad_anchor_is_found(tmp_path):
    [problem] = _problems(tmp_path, {"README.md": "a\n\n[x](docs/GUIDE.md#the-flops)\n"})
    assert problem.where == "README.md:3" and "#the-flops" in problem.why


def test_a_bad_anchor_in_a_notebook_is_found_with_its_cell(tmp_path):
    problems = _problems(tmp_path, {"notebooks/02_b.ipynb": _notebook(
        ("markdown", "# Two"), ("markdown", "ok\n[x](02_b.ipynb#three)"),
        ("code", "y = 2\n# docs/MISSING.md\n"))})
    assert [(p.where, p.reference) for p in problems] == [
        ("notebooks/02_b.ipynb:cell 2 line 2", "02_b.ipynb#three"),
        ("notebooks/02_b.ipynb:cell 3 line 2", "docs/MISSING.md")]


def test_design_file_mentions_are_found_everywhere(tmp_path):
    name = DESIGN_FILES[1]
    problems = _problems(tmp_path, {
        "README.md": f"As {name} says.\n",
        "blockmem_lite/x/y.py": f'"""The model ({DESIGN_FILES[0]} 1.2)."""\n',
        "tests/test_z.py": f"# {DESIGN_FILES[3]}\n",
        "notebooks/03_c.ipynb": _notebook(("code", f'print("{DESIGN_FILES[2]}")'))})
    assert sorted((p.where, p.reference) for p in problems) == sorted([
        ("README.md:1", name), ("blockmem_lite/x/y.py:1", DESIGN_FILES[0]),
        ("tests/test_z.py:1", DESIGN_FILES[3]),
        ("notebooks/03_c.ipynb:cell 1 line 1", DESIGN_FILES[2])])


def test_a_design_file_the_repository_holds_may_be_named(tmp_path):
    name = DESIGN_FILES[0]
    assert _problems(tmp_path, {f"docs/{name}": "# M\n", "README.md": f"[m](docs/{name})\n"}) \
        == []


def test_paths_outside_the_repository_are_found(tmp_path):
    problems = _problems(tmp_path, {
        "docs/OUT.md": "Read ../../shared/design/notes.md and /work/shared/x, "
                       "[up](../../elsewhere.md), [abs](/etc/hosts).\n"})
    assert sorted(p.reference for p in problems) == sorted(
        ["../../shared/design/notes.md", "/work/shared/x", "../../elsewhere.md", "/etc/hosts"])
    assert all(p.where == "docs/OUT.md:1" for p in problems)


def test_bare_references_to_missing_files_are_found(tmp_path):
    problems = _problems(tmp_path, {
        "README.md": "`blockmem_lite/models/gone.py`, tests/test_none.py, NOTES.md, "
                     "docs/GUIDE.md, 3.5/2.0, tokens/s, `x/nbNN.py`, DIR/report.md.\n"})
    assert [p.reference for p in problems] == ["blockmem_lite/models/gone.py",
                                               "tests/test_none.py", "NOTES.md"]


# --- the repository ------------------------------------------------------------------------

def test_the_generated_lab_report_links_only_the_plots_beside_it(tmp_path):
    from blockmem_lite.lab.report import PLOTS, plots_line
    assert "](" not in plots_line("class", [])
    assert "reproduce --preset class" in plots_line("class", [])
    line = plots_line("class", PLOTS[:2])
    assert all(f"(plots/{name}.html)" in line for name in PLOTS[:2])
    assert f"plots/{PLOTS[2]}.html" not in line


def test_every_reference_of_the_repository_resolves():
    problems = scan(ROOT)
    assert not problems, f"{len(problems)} broken references:\n" + \
        "\n".join(map(str, problems))
