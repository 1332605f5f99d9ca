"""A static site of the notebooks: ``python -m blockmem_lite site [--preset fast|class]``.

Every teaching notebook ``notebooks/NN_topic.ipynb`` (and with ``--with-solutions`` the
solution notebooks) is executed headless in a fresh kernel and exported to HTML with its
outputs, by nbconvert. Plotly figures stay interactive: their JSON outputs become a ``<div>``
drawn by the plotly.js that ships with the plotly package, copied once into
``assets/`` (with MathJax for the equations), so the pages work offline and without Jupyter. ``index.html`` holds the
notebook map (the README's table) with links to the pages. The SVG diagrams the
notebooks show (``notebooks/figures/``) are copied along.

Headless means the live dashboards print their text lines (a static page cannot run a
widget); the figures drawn after training are there. A cell that fails stops the build
with the notebook and cell named: a page with a traceback is never published. A cell that
runs past ``--cell-timeout`` seconds fails its notebook's page only: the other notebooks
are built, and the build ends with an error naming each notebook and cell that timed out.
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
from blockmem_lite.tools.exercises import ExerciseError, notebooks_dir, read_notebook

PRESETS = ("fast", "class")
PLOTLY_MIME = "application/vnd.plotly.v1+json"
PLOTLY_ASSET = "assets/plotly.min.js"
MATHJAX_ASSET = "assets/mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"  # the configs it ships
MATHJAX_CDN = "https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/MathJax.js?config=TeX-AMS_CHTML-full,Safe"
FIGURE_CLASS = "blockmem-figure"
CELL_TIMEOUT_S = {"fast": 600, "class": 1200}   # per cell; fast: as the suite's nbval runs
STOP_GRACE_S = 30                                # to shut the kernel down after Ctrl-C
_TABLE_ROW = re.compile(r"^\|\s*(?P<nn>\d{2})\s*\|\s*\[(?P<name>[^\]]+)\]\([^)]*\)\s*\|"
                        r"\s*(?P<what>.*?)\s*\|")


class SiteError(RuntimeError):
    """The site could not be built; the message names the notebook and the cell."""


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
    started: list[int] = []                       # the index of each cell as it starts
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}},
                            shutdown_kernel="immediate",     # a busy kernel, stopped, is quiet
                            on_cell_start=lambda cell, cell_index: started.append(cell_index))
    saved = {k: os.environ.get(k) for k in (*run_environment("fast"), "BLOCKMEM_FAST")}
    os.environ.update(run_environment(preset))
    if preset != "fast":
        os.environ.pop("BLOCKMEM_FAST", None)
    try:
        _run_client(client)
    except CellExecutionError as err:
        raise SiteError(f"{path.name}: a cell failed, so its page is not built:\n"
                        f"{_error_text(str(err))}") from None
    except CellTimeoutError:
        raise NotebookTimedOut(f"{path.name}: {_cell_named(nb, started[-1])} ran past "
                               f"--cell-timeout {cell_timeout} s, so its page is not built") \
            from None
    except DeadKernelError:
        raise SiteError(f"{path.name}: the kernel died in {_cell_named(nb, started[-1])} (out "
                        "of memory, or the cell ended the process), so its page is not built") \
            from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
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
    """Replace every plotly JSON output by its HTML (in place); returns how many."""
    count = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if PLOTLY_MIME not in data:
                continue
            figure = data.pop(PLOTLY_MIME)
            figure = json.loads(figure) if isinstance(figure, str) else figure
            data["text/html"] = _figure_html(figure, f"{page_id}-fig{count}")
            count += 1
    return count


def to_html(nb, title: str, mathjax: str) -> str:
    """The page: nbconvert's lab template with the local plotly.js and MathJax. The
    template's require.js (from a CDN) is left out: no widget state is embedded, and it
    would claim plotly.js as an AMD module and leave ``Plotly`` undefined."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", mathjax_url=mathjax)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    body = body.replace(f'<script src="{exporter.require_js_url}"></script>', "", 1)
    body = body.replace("<head>", f'<head>\n<script src="{PLOTLY_ASSET}"></script>', 1)
    nav = ('<nav style="padding: 8px 16px; font-family: sans-serif; border-bottom: 1px solid '
           '#ddd"><a href="index.html">&larr; all notebooks</a></nav>')
    return re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + nav, body, count=1)


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


def index_html(pages: list[Page], descriptions: dict[str, str], preset: str) -> str:
    rows = []
    for page in pages:
        nn = page.source.name[:2]
        what = _markdown(descriptions[nn]) if nn in descriptions else ""
        kind = "solutions" if page.source.parent.name == "solutions" else ""
        label = html.escape(page.title) + (" <em>(worked answers)</em>" if kind else "")
        rows.append(f'<tr><td>{nn}</td><td><a href="{page.html_name}">{label}</a></td>'
                    f"<td>{what}</td><td>{page.figures}</td></tr>")
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
</style></head>
<body>
<h1>blockmem_lite: the notebooks</h1>
<p>Memory-augmented, long-context Transformers built from scratch in small steps: dense
attention, BCMT, CAT, ARMT and MoC, then all of them side by side. Each page is a notebook
as it ran, with its outputs; the figures are interactive (hover, zoom). Live training
widgets appear as the text lines they print when run headless.</p>
<p>Built {built} in <b>{preset}</b> mode
({"tiny models, as in CI" if preset == "fast" else "the class-sized models"}).</p>
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
    """Execute, convert and index; returns the pages (``out``/index.html lists them).
    ``cell_timeout``: seconds a cell may run (default ``CELL_TIMEOUT_S[preset]``); a
    notebook past it has no page, and NotebookTimedOut names them all at the end."""
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
    pages, timed_out = [], []
    for n, path in enumerate(paths, 1):
        t0 = time.perf_counter()
        log(f"[{n}/{len(paths)}] {path.relative_to(root)}: running ({preset} mode) ...")
        try:
            nb = execute(path, preset, cell_timeout)
        except NotebookTimedOut as err:
            log(f"[{n}/{len(paths)}] {err}")
            timed_out.append(str(err))
            continue
        errors = error_outputs(nb)
        if errors:
            raise SiteError(f"{path.name}: error outputs in {', '.join(errors)}")
        name = page_name(path)
        figures = inline_figures(nb, Path(name).stem)
        title = notebook_title(nb, path.stem)
        atomic_write_bytes(out / name, to_html(nb, title, mathjax).encode("utf-8"))
        pages.append(Page(path, name, title, figures, time.perf_counter() - t0))
        log(f"[{n}/{len(paths)}] {name}: {figures} figures, {pages[-1].seconds:.0f} s")
    readme = root.parent / "README.md"
    atomic_write_bytes(out / "index.html",
                       index_html(pages, notebook_map(readme), preset).encode("utf-8"))
    log(f"site: {len(pages)} pages in {out}/ (open {out}/index.html)")
    if timed_out:
        raise NotebookTimedOut(f"{len(timed_out)} of {len(paths)} notebooks have no page: "
                               + "; ".join(timed_out))
    return pages


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
