"""A static site of the notebooks: ``python -m blockmem_lite site [--preset fast|class]``.

Every teaching notebook ``notebooks/NN_topic.ipynb`` (and with ``--with-solutions`` the
solution notebooks) is executed headless in a fresh kernel and exported to HTML with its
outputs, by nbconvert. Plotly figures stay interactive: their JSON outputs become a ``<div>``
drawn by the plotly.js that ships with the plotly package, copied once into
``assets/`` (with MathJax for the equations, set to the STIX fonts it ships), so the pages
work offline and without Jupyter: no page fetches anything from the network.
``index.html`` holds the notebook map (the README's table) with links to the pages. The
SVG diagrams the notebooks show (``notebooks/figures/``) are copied along. A link to
another notebook of the site goes to its page; a link to any other file of the repository
(``docs/PAPERS.md``, the exercise notebooks) becomes its text and the file's path.

Headless means the live dashboards print their text lines (a static page cannot run a
widget); the figures drawn after training are there. No widget state is published (a
working copy saved by JupyterLab holds some): a widget's output says it needs Jupyter.
A notebook that fails (a cell raises, the kernel dies, or a cell runs past
``--cell-timeout`` seconds) gets no page of its outputs: its page and its row in the
index say why, the other notebooks are built, and the build ends with an error naming
each notebook and cell that failed. A page with a traceback is never published.
Ctrl-C (or SIGTERM) stops at once: the kernel is shut down and no half-written page is
left (each page is written beside its final name, then renamed).

``make site`` builds the fast-mode site into ``site/`` (as CI does); ``make site
PRESET=class`` the class-mode one, as a teacher would publish it (much longer: the
notebooks train their class-sized models).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import html
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from blockmem_lite.__main__ import program
from blockmem_lite.checkpoints import atomic_write_bytes, prepare_folder
from blockmem_lite.runtime import environment
from blockmem_lite.tools.exercises import ExerciseError, notebooks_dir, read_notebook

PRESETS = ("fast", "class")
PLOTLY_MIME = "application/vnd.plotly.v1+json"
PLOTLY_ASSET = "assets/plotly.min.js"
MATHJAX_ASSET = "assets/mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"  # the configs it ships
MATHJAX_CDN = "https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/MathJax.js?config=TeX-AMS_CHTML-full,Safe"
# jupyter-server-mathjax ships MathJax 2 with the STIX-Web fonts only: its default TeX fonts
# are missing (so \begin{cases}, primes and more fail with "[Math Processing Error]").
# MathJax_Blank, its font-loading probe, points at about:blank, which a file:// page
# refuses; an empty data: URL fails the same harmless way. The hidden MathML copy of each
# formula (for screen readers) would load TeX fonts for \mathbb and the like: it needs none.
MATHJAX_CONFIG = """<script type="text/x-mathjax-config">
MathJax.Hub.Config({"HTML-CSS": {availableFonts: [], preferredFont: null, webFont: "STIX-Web",
  imageFont: null, styles: {"@font-face": {"font-family": "MathJax_Blank", src: "url('data:,')"}}}});
</script>
<style>.MJX_Assistive_MathML * { font-family: inherit !important; }</style>
"""
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ("<p><em>An interactive widget: it works when the notebook runs in "
               "Jupyter.</em></p>")
FIGURE_CLASS = "blockmem-figure"
CELL_TIMEOUT_S = {"fast": 600, "class": 1200}   # per cell; fast: as the suite's nbval runs
STOP_GRACE_S = 30                                # to shut the kernel down after Ctrl-C
_TABLE_ROW = re.compile(r"^\|\s*(?P<nn>\d{2})\s*\|\s*\[(?P<name>[^\]]+)\]\([^)]*\)\s*\|"
                        r"\s*(?P<what>.*?)\s*\|")


class SiteError(RuntimeError):
    """The site could not be built; the message names the notebook and the cell, ``reason``
    says it in one line (what a failed notebook's page and index row show)."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message.splitlines()[0]


class NotebookTimedOut(SiteError):
    """A cell ran past the cell timeout: that notebook has no page; the others are built."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, which stops the build as Ctrl-C does."""


@dataclass
class Page:
    source: Path          # the notebook
    html_name: str        # its page, relative to the site folder
    title: str
    figures: int          # interactive plotly figures on the page
    seconds: float        # execution time
    failed: str = ""      # why the notebook has no page of outputs ("" when it has one)


# --- running a notebook -------------------------------------------------------------------------


def run_environment(preset: str) -> dict[str, str]:
    """The variables a notebook runs under: fast mode or not, always headless and offline."""
    env = {"BLOCKMEM_HEADLESS": "1", "PLOTLY_RENDERER": "plotly_mimetype",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    if preset == "fast":
        env["BLOCKMEM_FAST"] = "1"
    return env


def execute(path: Path, preset: str, cell_timeout: int):
    """The notebook executed in a fresh kernel; SiteError naming the cell that failed,
    NotebookTimedOut naming the one that ran past ``cell_timeout`` seconds."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = read_notebook(path)
    nb.metadata.pop("widgets", None)              # a working copy's saved widget state
    started: list[int] = []                       # the index of each cell as it starts
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}},
                            shutdown_kernel="immediate",     # a busy kernel, stopped, is quiet
                            store_widget_state=False,
                            on_cell_start=lambda cell, cell_index: started.append(cell_index))
    env = {key: None for key in run_environment("fast")} | run_environment(preset)
    try:
        with environment(env):                    # BLOCKMEM_FAST unset for another preset
            _run_client(client)
    except CellExecutionError as err:
        raise SiteError(f"{path.name}: a cell failed, so its page is not built:\n"
                        f"{_error_text(str(err))}",
                        f"{path.name}: {_cell_named(nb, started[-1])} raised "
                        f"{err.ename}: {_error_text(err.evalue, 200)}") from None
    except CellTimeoutError:
        raise NotebookTimedOut(f"{path.name}: {_cell_named(nb, started[-1])} ran past "
                               f"--cell-timeout {cell_timeout} s, so its page is not built") \
            from None
    except DeadKernelError:
        raise SiteError(f"{path.name}: the kernel died in {_cell_named(nb, started[-1])} (out "
                        "of memory, or the cell ended the process), so its page is not built") \
            from None
    return nb


def _cell_named(nb, index: int) -> str:
    """``cell N ('its first line')``, N counted from 0 as in ``error_outputs``."""
    first = (nb.cells[index].source.strip().splitlines() or [""])[0][:60]
    return f"cell {index} ({first!r})"


def _run_client(client) -> None:
    """``client``'s execution in a worker thread with its own event loop, so Ctrl-C reaches
    this thread as a KeyboardInterrupt (in the main thread nbclient's own signal handler
    kills the kernel mid-cell and leaves a DeadKernelError). On Ctrl-C the execution is
    cancelled, which shuts its kernel down, and the interrupt goes on. (It waits on an
    Event: a ``Thread.join`` that a signal interrupted returns at once from then on.)"""
    loop = asyncio.new_event_loop()
    execution = loop.create_task(client.async_execute())
    raised: list[BaseException] = []
    finished = threading.Event()

    def work() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(execution)
        except BaseException as err:                    # handed to the waiting thread
            raised.append(err)
        finally:                                        # a timeout leaves nbclient's pollers
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()
            finished.set()

    threading.Thread(target=work, name="site-notebook", daemon=True).start()
    try:
        while not finished.wait(0.2):
            pass
    except KeyboardInterrupt:
        with contextlib.suppress(RuntimeError):         # the loop may have just closed
            loop.call_soon_threadsafe(execution.cancel)
        finished.wait(STOP_GRACE_S)
        raise
    if raised:
        raise raised[0]


def _error_text(text: str, limit: int = 2000) -> str:
    """The cell's error without colour codes or blank lines: its last ``limit`` characters."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return "\n".join(line for line in plain.splitlines() if line.strip())[-limit:]


def error_outputs(nb) -> list[str]:
    """``cell N: EName`` for every error output (none in a notebook that ran cleanly)."""
    return [f"cell {i}: {o.get('ename', 'error')}" for i, cell in enumerate(nb.cells)
            for o in cell.get("outputs", []) if o.get("output_type") == "error"]


# --- plotly outputs as offline HTML ----------------------------------------------------------


def _figure_html(figure: dict, element_id: str) -> str:
    """A div and the script that draws ``figure`` (plotly's JSON) into it."""
    spec = json.dumps({"data": figure.get("data", []), "layout": figure.get("layout", {}),
                       "config": {"responsive": True, "displaylogo": False}})
    spec = spec.replace("</", "<\\/")                      # never end the script early
    return (f'<div class="{FIGURE_CLASS}" id="{element_id}"></div>\n'
            f'<script>(function () {{ var f = {spec};\n'
            f'Plotly.newPlot("{element_id}", f.data, f.layout, f.config); }})();</script>')


def inline_figures(nb, page_id: str) -> int:
    """Replace every plotly JSON output by its HTML and every widget output by a note (in
    place); returns how many figures."""
    count = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_MIME in data:
                output["data"] = {"text/html": WIDGET_NOTE}
            if PLOTLY_MIME not in data:
                continue
            figure = data.pop(PLOTLY_MIME)
            figure = json.loads(figure) if isinstance(figure, str) else figure
            data["text/html"] = _figure_html(figure, f"{page_id}-fig{count}")
            count += 1
    return count


def to_html(nb, title: str, mathjax: str, links: Links | None = None) -> str:
    """The page: nbconvert's lab template with the local plotly.js and MathJax, its links
    rewritten by ``links``. The template's scripts from a CDN are left out: require.js (no
    widget state is embedded, and it would claim plotly.js as an AMD module and leave
    ``Plotly`` undefined) and mermaid's loader (the notebooks draw no mermaid diagram)."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", mathjax_url=mathjax)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    body = body.replace(f'<script src="{exporter.require_js_url}"></script>', "", 1)
    body = re.sub(r'<script type="module">(?:(?!</script>).)*?mermaid.*?</script>', "", body,
                  count=1, flags=re.S)
    body = body.replace("<head>", f'<head>\n<script src="{PLOTLY_ASSET}"></script>', 1)
    body = body.replace("<!-- Load mathjax -->", MATHJAX_CONFIG + "<!-- Load mathjax -->", 1)
    return _with_nav(links.rewrite(body) if links is not None else body)


def _with_nav(page: str) -> str:
    nav = ('<nav style="padding: 8px 16px; font-family: sans-serif; border-bottom: 1px solid '
           '#ddd"><a href="index.html">&larr; all notebooks</a></nav>')
    return re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + nav, page, count=1)


def failed_page(title: str, source: str, why: str) -> str:
    """The page of a notebook that failed: its title, why, and where the notebook is."""
    return _with_nav(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>
<body style="font-family: system-ui, sans-serif; max-width: 900px; margin: 0 auto">
<h1>{html.escape(title)}</h1>
<p><strong>This page was not built:</strong> {html.escape(why)}</p>
<p>The notebook is <code>{html.escape(source)}</code> in the repository: run it in Jupyter,
or build the site again.</p>
</body></html>
""")


# --- links --------------------------------------------------------------------------------------

_ANCHOR = re.compile(r'<a\b([^>]*?)\bhref="([^"]*)"([^>]*)>(.*?)</a>', re.S)
_IMAGE = re.compile(r'(<img\b[^>]*?\bsrc=")([^"]*)(")')
_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#|//)", re.I)


class Links:
    """How a page's links are rewritten: a link to a notebook with a page (``pages``:
    repository path -> page name) goes to that page, a link into a folder the site copied
    (``copied``: repository folder -> site folder) goes to the copy, and any other relative
    link (another file of the repository) becomes its text and the file's path, never a
    dead link. ``here``: the page's own folder in the repository, where relative links
    start from."""

    def __init__(self, pages: dict[str, str], copied: dict[str, str], here: str):
        self.pages, self.copied, self.here = pages, copied, here

    def at(self, here: str) -> Links:
        """The same links for a page of the folder ``here``."""
        return Links(self.pages, self.copied, here)

    def target(self, href: str) -> tuple[str, str]:
        """(repository path, #fragment or "") of a relative ``href``."""
        path, _, fragment = html.unescape(href).partition("#")
        where = os.path.normpath(os.path.join(self.here, path)) if path else self.here
        return where.replace(os.sep, "/") + ("/" if path.endswith("/") else ""), \
            (f"#{fragment}" if fragment else "")

    def rewrite(self, page: str) -> str:
        def one(m: re.Match) -> str:
            before, href, after, text = m.groups()
            if _EXTERNAL.match(href):
                return m.group(0)
            path, fragment = self.target(href)
            site = self.pages.get(path) or self._copy(path)
            if site is not None:
                return f'<a{before}href="{html.escape(site + fragment)}"{after}>{text}</a>'
            shown = html.escape(path + fragment)
            plain = re.sub(r"<[^>]+>", "", text)
            if path.rstrip("/") in html.unescape(plain):
                return f'<span class="repo-path">{text}</span>'
            return f'<span class="repo-path">{text}</span> (<code>{shown}</code>)'

        def image(m: re.Match) -> str:
            src = m.group(2)
            site = None if _EXTERNAL.match(src) else self._copy(self.target(src)[0])
            return m.group(0) if site is None else f"{m.group(1)}{html.escape(site)}{m.group(3)}"

        return _IMAGE.sub(image, _ANCHOR.sub(one, page))

    def _copy(self, path: str) -> str | None:
        """Where the site copied the repository file ``path`` (None: nowhere)."""
        for folder, site in self.copied.items():
            if path.startswith(folder + "/"):
                return site + path[len(folder):]
        return None


def notebook_title(nb, fallback: str) -> str:
    """The first markdown heading, without its # marks."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return fallback


# --- the index ----------------------------------------------------------------------------------


def notebook_map(readme: Path) -> dict[str, str]:
    """``NN -> what you build and see`` from the README's notebook map table."""
    if not readme.exists():
        return {}
    rows = (_TABLE_ROW.match(line) for line in readme.read_text(encoding="utf-8").splitlines())
    return {m.group("nn"): m.group("what") for m in rows if m}


def _markdown(text: str) -> str:
    from nbconvert.filters.markdown import markdown2html

    plain = re.sub(r"\(\[exercises\]\([^)]*\)\)", "", text)     # links into the repo
    return markdown2html(plain).removeprefix("<p>").removesuffix("</p>\n").removesuffix("</p>")


def index_html(pages: list[Page], descriptions: dict[str, str], preset: str,
               links: Links | None = None) -> str:
    """Every notebook of the build in order, a failed one marked with why."""
    rows = []
    for page in pages:
        nn = page.source.name[:2]
        what = _markdown(descriptions[nn]) if nn in descriptions else ""
        if links is not None:
            what = links.rewrite(what)
        kind = "solutions" if page.source.parent.name == "solutions" else ""
        label = html.escape(page.title) + (" <em>(worked answers)</em>" if kind else "")
        if page.failed:
            what += (f'{"<br>" if what else ""}<span class="failed"><b>Not built:</b> '
                     f"{html.escape(page.failed)}</span>")
        row = '<tr class="failed">' if page.failed else "<tr>"
        rows.append(f'{row}<td>{nn}</td><td><a href="{page.html_name}">{label}</a></td>'
                    f"<td>{what}</td><td>{'-' if page.failed else page.figures}</td></tr>")
    failed = sum(bool(p.failed) for p in pages)
    warning = (f'<p class="failed"><b>{failed} of {len(pages)} notebooks failed to build</b>: '
               "their rows below say why.</p>" if failed else "")
    built = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>blockmem_lite notebooks</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }}
table {{ border-collapse: collapse; width: 100%; }}
td, th {{ border-bottom: 1px solid #ddd; padding: 6px 8px; vertical-align: top;
         text-align: left; }}
td:first-child, td:last-child {{ white-space: nowrap; }}
.failed {{ color: #b00020; }}
tr.failed a {{ color: #b00020; }}
</style></head>
<body>
<h1>blockmem_lite: the notebooks</h1>
<p>Memory-augmented, long-context Transformers built from scratch in small steps: dense
attention, BCMT, CAT, ARMT and MoC, then all of them side by side. Each page is a notebook
as it ran, with its outputs; the figures are interactive (hover, zoom). Live training
widgets appear as the text lines they print when run headless.</p>
<p>Built {built} in <b>{preset}</b> mode
({"tiny models, as in CI" if preset == "fast" else "the class-sized models"}).</p>
{warning}
<table><tr><th>#</th><th>notebook</th><th>what you build and see</th><th>figures</th></tr>
{chr(10).join(rows)}
</table>
</body></html>
"""


# --- building -----------------------------------------------------------------------------------


def site_notebooks(root: Path, with_solutions: bool, only: list[str] | None) -> list[Path]:
    paths = sorted(root.glob("[0-9][0-9]_*.ipynb"))
    if with_solutions:
        paths += sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb"))
    if only:
        unknown = sorted(set(only) - {p.name[:2] for p in paths})
        if unknown:
            have = sorted({p.name[:2] for p in paths})
            raise SiteError(f"--notebook {', '.join(unknown)} is not allowed: expected one of "
                            f"{', '.join(have)}")
        paths = [p for p in paths if p.name[:2] in only]
    if not paths:
        raise SiteError(f"no notebooks NN_topic.ipynb under {root}")
    return paths


def page_name(path: Path) -> str:
    prefix = "solutions-" if path.parent.name == "solutions" else ""
    return prefix + path.stem + ".html"


def build(out: Path, preset: str = "fast", with_solutions: bool = False,
          only: list[str] | None = None, root: Path | None = None, log=print,
          cell_timeout: int | None = None) -> list[Page]:
    """Execute, convert and index; returns the pages (``out``/index.html lists them all).
    ``cell_timeout``: seconds a cell may run (default ``CELL_TIMEOUT_S[preset]``). A
    notebook that fails gets a page saying why; the build goes on and then raises
    NotebookTimedOut (only timeouts) or SiteError, naming every failed notebook."""
    if preset not in PRESETS:
        raise SiteError(f"--preset {preset!r} is not allowed: expected one of "
                        f"{', '.join(PRESETS)}")
    cell_timeout = CELL_TIMEOUT_S[preset] if cell_timeout is None else cell_timeout
    if isinstance(cell_timeout, bool) or not isinstance(cell_timeout, int) or cell_timeout < 1:
        raise SiteError(f"--cell-timeout {cell_timeout!r} is not allowed: expected whole "
                        "seconds >= 1")
    root = root or notebooks_dir()
    paths = site_notebooks(root, with_solutions, only)
    try:
        prepare_folder(out, name="--out")
    except ValueError as err:
        raise SiteError(str(err)) from None
    mathjax = _copy_assets(root, out, log)
    repo = root.parent
    links = Links({_in_repo(p, repo): page_name(p) for p in paths},
                  {_in_repo(root / "figures", repo): "figures"}, here="")
    pages, failures = [], []
    for n, path in enumerate(paths, 1):
        log(f"[{n}/{len(paths)}] {path.relative_to(root)}: running ({preset} mode) ...")
        page, failure = _one_page(path, out, preset, cell_timeout, mathjax,
                                  links.at(_in_repo(path.parent, repo)), repo)
        pages.append(page)
        if failure is None:
            log(f"[{n}/{len(paths)}] {page.html_name}: {page.figures} figures, "
                f"{page.seconds:.0f} s")
        else:
            failures.append(failure)
            log(f"[{n}/{len(paths)}] {page.html_name}: not built: {page.failed}")
    readme = repo / "README.md"
    atomic_write_bytes(out / "index.html", index_html(pages, notebook_map(readme), preset,
                                                      links).encode("utf-8"))
    log(f"site: {len(pages) - len(failures)} of {len(pages)} pages in {out}/ "
        f"(open {out}/index.html)")
    if failures:
        _raise_failures(failures, len(paths))
    return pages


def _in_repo(path: Path, repo: Path) -> str:
    """``path`` relative to the repository, with / separators."""
    return path.resolve().relative_to(repo.resolve()).as_posix()


def _one_page(path: Path, out: Path, preset: str, cell_timeout: int, mathjax: str,
              links: Links, repo: Path) -> tuple[Page, SiteError | None]:
    """Execute ``path`` and write its page; on a failure write a page saying why. Returns
    the page and the failure (None when it was built)."""
    t0 = time.perf_counter()
    name = page_name(path)
    try:
        nb = execute(path, preset, cell_timeout)
        errors = error_outputs(nb)
        if errors:
            raise SiteError(f"{path.name}: error outputs in {', '.join(errors)}")
    except SiteError as err:
        title = notebook_title(read_notebook(path), path.stem)
        why = err.reason.removeprefix(f"{path.name}: ")
        atomic_write_bytes(out / name, failed_page(title, _in_repo(path, repo), why)
                           .encode("utf-8"))
        return Page(path, name, title, 0, time.perf_counter() - t0, failed=why), err
    figures = inline_figures(nb, Path(name).stem)
    title = notebook_title(nb, path.stem)
    atomic_write_bytes(out / name, to_html(nb, title, mathjax, links).encode("utf-8"))
    return Page(path, name, title, figures, time.perf_counter() - t0), None


def _raise_failures(failures: list[SiteError], total: int) -> None:
    """One error for every failed notebook: each failed cell's error text, then one line
    naming them all (NotebookTimedOut when every failure is a timeout)."""
    details = [str(f) for f in failures if "\n" in str(f)]
    summary = (f"{len(failures)} of {total} notebooks have no page: "
               + "; ".join(f.reason for f in failures))
    if all(isinstance(f, NotebookTimedOut) for f in failures):
        raise NotebookTimedOut(summary)
    raise SiteError("\n".join([*details, summary]), summary)


def _copy_assets(root: Path, out: Path, log) -> str:
    """plotly.js from the installed plotly package, MathJax from jupyter-server-mathjax and
    the notebooks' diagrams; returns the MathJax URL the pages load (a CDN without it)."""
    import plotly

    source = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not source.exists():
        raise SiteError(f"plotly.js not found at {source}: reinstall plotly "
                        "(pip install -e '.[notebooks]')")
    atomic_write_bytes(out / PLOTLY_ASSET, source.read_bytes())
    figures = root / "figures"
    if figures.is_dir():
        shutil.copytree(figures, out / "figures", dirs_exist_ok=True)
    try:
        import jupyter_server_mathjax
    except ImportError:
        log("site: jupyter-server-mathjax is not installed, so the pages load MathJax from a "
            "CDN (equations render only online): pip install -e '.[notebooks]'")
        return MATHJAX_CDN
    static = Path(jupyter_server_mathjax.__file__).parent / "static"
    shutil.copytree(static, out / "assets" / "mathjax", dirs_exist_ok=True)
    return MATHJAX_ASSET


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{program()} site",
                                description="Build static HTML pages of the notebooks, with "
                                            "their outputs and interactive figures.")
    p.add_argument("--preset", default="fast", choices=PRESETS,
                   help="fast: tiny models, as CI (default); class: the class-sized models")
    p.add_argument("--out", type=Path, default=Path("site"), help="output folder (default site)")
    p.add_argument("--with-solutions", action="store_true",
                   help="also publish the solution notebooks (the exercises' answers)")
    p.add_argument("--notebook", action="append", metavar="NN",
                   help="only notebook NN (repeatable)")
    p.add_argument("--cell-timeout", type=_seconds, default=None, metavar="S",
                   help="seconds a cell may run before its notebook fails (default: "
                        + ", ".join(f"{k} {v}" for k, v in CELL_TIMEOUT_S.items()) + ")")
    return p


def _seconds(text: str) -> int:
    """--cell-timeout's value: whole seconds >= 1."""
    try:
        seconds = int(text)
    except ValueError:                                   # "1.5", "soon"
        seconds = 0
    if seconds < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: expected whole seconds "
                                         ">= 1, e.g. 600")
    return seconds


@contextlib.contextmanager
def _sigterm_stops():
    """SIGTERM raises Terminated while building, so it stops as Ctrl-C does (the kernel,
    in a session of its own, shut down) instead of killing this process alone."""
    def stop(signum, frame):
        raise Terminated

    ours = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    previous = signal.signal(signal.SIGTERM, stop) if ours else None
    try:
        yield
    finally:
        if ours:
            signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    """``python -m blockmem_lite site ...``: 0 built, 1 some notebooks timed out, 2 a bad
    argument or a failed cell, 130 (Ctrl-C) or 143 (SIGTERM) stopped."""
    args = _parser().parse_args(argv)
    try:
        with _sigterm_stops():
            build(args.out, args.preset, args.with_solutions, args.notebook,
                  cell_timeout=args.cell_timeout)
    except NotebookTimedOut as err:
        print(f"site: {err}", file=sys.stderr)
        return 1
    except (SiteError, ExerciseError) as err:
        print(f"site: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        print("site: interrupted; the pages written so far are complete, index.html is not "
              "updated", file=sys.stderr)
        return 143 if isinstance(err, Terminated) else 130
    return 0
