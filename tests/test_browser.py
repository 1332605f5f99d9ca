"""The notebooks in a real browser: JupyterLab + headless Chromium (playwright), Run All.

For each notebook in NOTEBOOKS, once (a module fixture): serve a temporary copy of
``notebooks/`` (autosave never touches the repo) with ``jupyter lab`` on a free port,
open the notebook in headless Chromium, Run > Run All Cells through the menu bar, and
record in the page, every 25 ms and on every plotly event, each chart's points per trace,
title, axes and drawn SVG points, and the text of each HTML widget; then press
ArrowRight twice on the first handle of the ``slider_figure`` cell. The tests assert:

* the live dashboard is drawn in a widget; its three rows (loss, tokens/s, memory)
  share the step axis 0..total, the memory axis names its reading, and every row gained
  points across at least MIN_LIVE_REDRAWS redraws made while training ran (the title
  still said ``step n/N``), as did the status line above it;
* the other live views, in a notebook of their own (LIVE_VIEWS, fed made-up steps, no
  training): a comparison of two runs and a monitor drawing a figure of two subplots
  (the ones a FigureWidget left blank) have their traces drawn while the cell still
  runs, read from the plotly element's own data;
* the slider's readout moved and what it shows changed (the figure's data, or the
  printed text); its label is shown whole;
* no cell output is an error (error outputs, stderr tracebacks, widgets that failed to
  display) and every code cell ran;
* the browser console logged no error and the page raised none;
* the server answered no request with a 5xx status (failures quote its log's errors).

Waits follow the work done (STALL_S): a slow, busy machine gives a slow pass.

The only change to the copies: the dashboards train ``Case.steps`` steps (why: see
NOTEBOOKS). Skipped without Chromium (``chromium``, ``chromium-browser``,
``google-chrome`` on PATH, or ``BLOCKMEM_CHROMIUM``) or without playwright; playwright's
own browsers are never used (no ``playwright install``). The server runs with
BLOCKMEM_FAST=1 and without BLOCKMEM_HEADLESS and PLOTLY_RENDERER, so widgets render as
in class. Screenshots (whole page after Run All, the dashboard cell, the slider cell
before/after) are named in every failure message.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from blockmem_lite.tools.exercises import notebooks_dir
from blockmem_lite.viz.live_base import STATUS_CLASS

pytestmark = pytest.mark.browser


@dataclass(frozen=True)
class Case:
    """A notebook to run: its ``slider_figure`` shows a plotly figure ("figure") or printed
    text ("text"); ``steps``: how long its LiveDashboard trains here (see below)."""

    slider: str
    steps: int


# Why the steps are raised (the one change made to the copies, in their parameters cell,
# ``cfg = cfg.replace(steps=N)``): fast-mode training is over in about a second, but every
# plotly FigureWidget first ships plotly's 5 MB widget bundle to the browser, which
# compiles it: 1.4-2.2 s from display() to the first drawn chart on a busy 2-core machine.
# A fast-mode dashboard there first appears when training is (nearly) done. A few seconds
# of training let the browser watch it; every other cell runs as committed.
TRAIN_STEPS_WHY = "browser test: train long enough to watch the dashboard update"
# One notebook per kind of slider output and of dashboard call: 00 builds its LiveDashboard
# by hand and its slider prints text; 02 trains through lessons.train_live and its slider
# draws a figure. The other notebooks use the same widget classes, and nbval runs them all
# headless (01 was here too: the same classes as 02, about 35 s of CI).
NOTEBOOKS = {
    "00_welcome_and_setup.ipynb": Case(slider="text", steps=480),
    "02_bcmt_blocks_and_decay_memory.ipynb": Case(slider="figure", steps=300),
}
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM_ENV = "BLOCKMEM_CHROMIUM"
VENV_BIN = Path(sys.executable).parent
# The waits follow the work: Run All may take as long as it keeps making progress (a
# prompt changed: a cell started or finished; or a figure or HTML widget redrew), and
# fails only after STALL_S without any, or after RUN_ALL_CAP_S in all (a hung kernel still
# ends). A slow machine gives a slow pass. STALL_S is far above the longest quiet stretch
# of these notebooks in fast mode (a few seconds on a quiet machine, under a minute at
# load 7 on 2 cores); it also bounds loading the page and starting the kernel.
STALL_S = 300
RUN_ALL_CAP_S = 1800
# The notebook on show. Hidden panels (lm-mod-hidden) stay in the DOM; scope to this one.
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
CELLS = f"{PANEL} .jp-Notebook .jp-Cell"
# Console noise that is not ours and cannot be avoided; each entry says why. Keep narrow.
CONSOLE_ALLOW: list[tuple[str, str]] = []


# ----------------------------------------------------------------------------- finding things


def find_chromium() -> str | None:
    """BLOCKMEM_CHROMIUM, else the first of chromium / chromium-browser / google-chrome."""
    explicit = os.environ.get(CHROMIUM_ENV)
    if explicit:
        return explicit if Path(explicit).is_file() else shutil.which(explicit)
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def cell_index(nb_path: Path, pattern: str) -> int:
    """The first code cell whose source matches ``pattern`` (a regex)."""
    cells = json.loads(nb_path.read_text(encoding="utf-8"))["cells"]
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code" and re.search(pattern, _source(cell)):
            return i
    raise AssertionError(f"{nb_path.name}: no code cell matches {pattern!r}")


def train_longer(nb_path: Path, steps: int) -> None:
    """Append ``cfg = cfg.replace(steps=N)`` to the notebook's parameters cell."""
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    source = _source(cell).rstrip("\n")
    cell["source"] = f"{source}\ncfg = cfg.replace(steps={steps})  # {TRAIN_STEPS_WHY}\n"
    nb_path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    base: str
    token: str
    root: Path                      # the notebook dir: a copy of notebooks/
    proc: subprocess.Popen
    log: Path

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(f"{self.base}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def session(self, nb_name: str) -> dict | None:
        for s in self.api("/api/sessions"):
            if s.get("path", "").endswith(nb_name) and s.get("kernel"):
                return s
        return None

    def kernel_state(self, nb_name: str) -> str | None:
        s = self.session(nb_name)
        return s["kernel"].get("execution_state") if s else None

    def shut_down(self, nb_name: str) -> None:
        """End the notebook's session and kernel (frees the CPU for the next notebook)."""
        s = self.session(nb_name)
        if s:
            self.api(f"/api/sessions/{s['id']}", method="DELETE")


def lab_settings(settings: Path) -> None:
    """Private user settings: the repo's jupyter/overrides.json (what `make lab` installs),
    plus no news / update toast over the notebook."""
    overrides = json.loads((notebooks_dir().parent / "jupyter" / "overrides.json").read_text())
    overrides.setdefault("@jupyterlab/apputils-extension:notification", {}).update(
        fetchNews="false", checkForUpdates=False)
    for plugin_id, values in overrides.items():
        package, plugin = plugin_id.split(":")
        path = settings / package / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def server_env(home: Path) -> dict:
    env = dict(os.environ, BLOCKMEM_FAST="1", OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONHASHSEED="0",
               PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # kernel: "python"
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               JUPYTER_PLATFORM_DIRS="1", JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_DATA_DIR=str(home / "data"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               IPYTHONDIR=str(home / "ipython"))
    for name in ("PLOTLY_RENDERER", "BLOCKMEM_HEADLESS"):   # widgets must render
        env.pop(name, None)
    # The copies train longer, on one thread: not the fast recipe whose ranges the nbval run
    # holds the notebooks to (blockmem_lite/expected.py), so a result here is only printed.
    env.pop("BLOCKMEM_EXPECT_STRICT", None)
    return env


def start_lab(workdir: Path) -> Lab:
    """jupyter lab on a free port with a token, in its own process group, serving a copy
    of notebooks/; private config, data, settings and workspaces."""
    root = workdir / "notebooks"
    shutil.copytree(notebooks_dir(), root,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    for name, case in NOTEBOOKS.items():
        train_longer(root / name, case.steps)
    home = workdir / "home"
    lab_settings(home / "lab-settings")
    port, token = free_port(), secrets.token_hex(16)
    cmd = [str(VENV_BIN / "jupyter"), "lab", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", "--ServerApp.port_retries=0", f"--ServerApp.token={token}",
           f"--notebook-dir={root}", "--LabApp.expose_app_in_browser=True",
           f"--LabApp.user_settings_dir={home / 'lab-settings'}",
           f"--LabApp.workspaces_dir={home / 'lab-workspaces'}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = workdir / "jupyter.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=workdir,
                                env=server_env(home), start_new_session=True)
    lab = Lab(f"http://127.0.0.1:{port}", token, root, proc, log)
    deadline = time.time() + 90
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited rc={proc.returncode}; see {log}")
        try:
            lab.api("/api/status")
            return lab
        except OSError:
            time.sleep(0.5)
    stop_lab(proc)
    raise TimeoutError(f"jupyter lab did not answer on {lab.base} in 90 s; see {log}")


def stop_lab(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (server and kernels), SIGKILL if it lingers."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ----------------------------------------------------------------------------- in the page

# Installed before the page loads. Every 25 ms and on every plotly event, for each plotly
# figure in the notebook on show, note (when it changed) its cell, its title, the points
# per trace with the trace's y axis, and the points of the lines SVG drew.
RECORDER = """
(() => {
  window.__bmPlots = [];
  const cellOf = el => {
    const cells = [...document.querySelectorAll('%(cells)s')];
    return cells.indexOf(el.closest('.jp-Cell'));
  };
  const state = el => ({
    t: performance.now(),
    cell: cellOf(el),
    inWidget: !!el.closest('.jupyter-widgets, .widget-box, .widget-output'),
    title: ((el.layout || {}).title || {}).text ?? null,
    traces: (el.data || []).map(tr => ({
      name: tr.name ?? null, yaxis: tr.yaxis || 'y',
      n: tr.x ? tr.x.length : (tr.z ? tr.z.length : 0)})),
    xRanges: ['xaxis', 'xaxis2', 'xaxis3'].map(a => ((el.layout || {})[a] || {}).range ?? null),
    memoryAxis: (((el.layout || {}).yaxis3 || {}).title || {}).text ?? null,
    axes: Object.keys(el._fullLayout || {}).filter(k => /^[xy]axis\\d*$/.test(k)).sort(),
    svgPoints: [...el.querySelectorAll('.scatterlayer path.js-line')]
      .reduce((s, p) => s + ((p.getAttribute('d') || '').match(/[ML]/g) || []).length, 0),
  });
  const note = el => {
    if (!el.__bmId) {
      el.__bmId = window.__bmPlots.length + 1;
      window.__bmPlots.push({id: el.__bmId, states: []});
    }
    const rec = window.__bmPlots[el.__bmId - 1];
    const s = state(el);
    const last = rec.states[rec.states.length - 1];
    const key = JSON.stringify([s.cell, s.title, s.traces, s.svgPoints, s.xRanges, s.memoryAxis,
                                s.axes]);
    if (!last || last.key !== key) { s.key = key; rec.states.push(s); }
  };
  window.__bmHtml = [];
  const lastHtml = new Map();
  const sweepHtml = () => {
    for (const el of document.querySelectorAll(
        '%(panel)s .jp-Cell .widget-html, %(panel)s .jp-Cell .%(status)s')) {
      const text = el.textContent;
      if (lastHtml.get(el) !== text) {
        lastHtml.set(el, text);
        window.__bmHtml.push({t: performance.now(), cell: cellOf(el), text});
      }
    }
  };
  // every DOM change, not only every 25 ms: on a busy machine several status updates can
  // land between two timer sweeps
  new MutationObserver(sweepHtml).observe(document,
    {subtree: true, childList: true, characterData: true});
  const sweep = () => {
    sweepHtml();
    for (const el of document.querySelectorAll('%(panel)s .js-plotly-plot')) {
      if (!el.__bmListening && typeof el.on === 'function') {
        el.__bmListening = true;
        for (const ev of ['plotly_afterplot', 'plotly_restyle', 'plotly_relayout',
                          'plotly_update', 'plotly_redraw']) el.on(ev, () => note(el));
      }
      note(el);
    }
  };
  setInterval(sweep, 25);
})();
""" % {"cells": CELLS, "panel": PANEL, "status": STATUS_CLASS}

# What each cell's outputs are, from the notebook model (exact, unlike rendered text).
MODEL_OUTPUTS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  return panel.content.model.sharedModel.cells.map((c, i) => ({
    index: i, type: c.cell_type, count: c.execution_count ?? null,
    outputs: (c.outputs || []).map(o => ({type: o.output_type, name: o.name ?? null,
      ename: o.ename ?? null, evalue: o.evalue ?? null,
      text: Array.isArray(o.text) ? o.text.join('') : (o.text ?? null)}))}));
}"""

# The rendered outputs: stderr blocks (error outputs render as stderr too) and any
# "Error displaying widget" / "Failed to load model class" from the widget manager.
DOM_ERRORS = """(cells) => [...document.querySelectorAll(cells)].flatMap((c, i) =>
  [...c.querySelectorAll('.jp-OutputArea-output')].map(o => ({index: i,
    mime: o.getAttribute('data-mime-type'), text: o.textContent}))
  .filter(o => (o.mime === 'application/vnd.jupyter.stderr' && /Traceback|Error/.test(o.text))
    || /Error displaying widget|Failed to load model class|model not found/i.test(o.text)))"""

# What a slider cell's output shows: figure data (x/y/z/text) and titles, and the text.
SLIDER_VIEW = """(cell) => {
  const out = cell.querySelector('.jp-OutputArea');
  const plots = [...out.querySelectorAll('.js-plotly-plot')].map(el => ({
    title: ((el.layout || {}).title || {}).text ?? null,
    data: (el.data || []).map(tr => JSON.stringify([tr.x, tr.y, tr.z, tr.text]))}));
  const readout = out.querySelector('.widget-readout');
  const labels = [...out.querySelectorAll('.widget-hbox')]
    .filter(row => row.querySelector('.widget-slider'))
    .map(row => {
      const l = row.querySelector('.widget-html-content') || row.querySelector('.widget-html');
      return l ? {text: l.textContent.trim(), clipped: l.scrollWidth > l.clientWidth + 1} : null;
    });
  const text = [...out.querySelectorAll('.widget-output .jp-OutputArea-output')]
    .filter(o => !o.querySelector('.js-plotly-plot')).map(o => o.textContent).join('\\n');
  return {plots, text, labels, readout: readout ? readout.textContent.trim() : null,
          sliders: out.querySelectorAll('.widget-slider .noUi-handle').length};
}"""


KERNEL_READY = """() => {
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const kernel = panel && panel.sessionContext && panel.sessionContext.session
                 && panel.sessionContext.session.kernel;
  return !!(kernel && panel.context.isReady && kernel.connectionStatus === 'connected'
            && kernel.status === 'idle');
}"""


def prompts(page) -> list[str]:
    return page.eval_on_selector_all(
        f"{CELLS} .jp-InputArea-prompt", "els => els.map(e => e.textContent.trim())")


def open_notebook(page, url: str, timeout_ms: int = STALL_S * 1000) -> None:
    """Load the lab page; wait for the cells and for the kernel indicator to say idle."""
    page.goto(url, wait_until="domcontentloaded", timeout=timeout_ms)
    page.wait_for_selector(CELLS, timeout=timeout_ms)
    # The toolbar indicator says idle before a kernel is there; Run All then runs nothing.
    # Wait for the session's kernel itself: connected and idle.
    page.wait_for_function(KERNEL_READY, timeout=timeout_ms)


def run_all(page) -> None:
    """Run > Run All Cells, through the menu bar, as a learner does."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()


# What moves while a cell runs: recorded figure states and HTML widget texts.
PROGRESS = """() => [(window.__bmPlots || []).reduce((n, p) => n + p.states.length, 0),
                     (window.__bmHtml || []).length]"""


def wait_until_idle(page, lab: Lab, nb_name: str, before: list[str] | None,
                    stall_s: float = STALL_S, cap_s: float = RUN_ALL_CAP_S,
                    settle_s: float = 1.5) -> None:
    """No '[*]' prompt, toolbar indicator idle and the server's kernel idle, for settle_s.
    With ``before`` (the prompts before a run) first wait until the prompts changed.

    Gives up after ``stall_s`` without progress (prompts, figures or widget texts
    changing) or ``cap_s`` in all, naming the cells still running or queued.
    """
    start = last_progress = time.time()
    seen, since = None, None
    while True:
        now, shown = time.time(), prompts(page)
        progress = (shown, page.evaluate(PROGRESS))
        if progress != seen:
            seen, last_progress = progress, now
        started = before is None or shown != before
        ok = (started and not any("*" in p for p in shown)
              and page.locator(f"{PANEL} .jp-Notebook-ExecutionIndicator[data-status='idle']")
              .count() > 0 and lab.kernel_state(nb_name) == "idle")
        since = (since or now) if ok else None
        if ok and now - since >= settle_s:
            return
        if now - last_progress > stall_s or now - start > cap_s:
            running = [i for i, p in enumerate(shown) if "*" in p]
            why = (f"no progress for {now - last_progress:.0f} s" if now - start <= cap_s
                   else f"still running after {cap_s:.0f} s")
            raise TimeoutError(f"{nb_name}: the kernel was not idle: {why} (after "
                               f"{now - start:.0f} s; cells still running or queued: "
                               f"{running[:5]})")
        time.sleep(0.25)


# ----------------------------------------------------------------------------- one notebook


@dataclass
class NotebookRun:
    """Everything the tests assert on, gathered once per notebook."""

    name: str
    dashboard_cell: int
    slider_cell: int
    slider_kind: str
    seconds: float = 0.0
    plots: list = field(default_factory=list)         # recorded states of every figure
    html: list = field(default_factory=list)          # recorded texts of HTML widgets
    cells: list = field(default_factory=list)         # MODEL_OUTPUTS
    dom_errors: list = field(default_factory=list)    # DOM_ERRORS
    slider: dict = field(default_factory=dict)        # before / after / error
    console: list = field(default_factory=list)       # console errors and page errors
    server_errors: list = field(default_factory=list)  # responses with a 5xx status
    screenshots: list = field(default_factory=list)
    log: Path | None = None                           # the jupyter server's log

    def shots(self) -> str:
        return "screenshots: " + ", ".join(str(p) for p in self.screenshots)


def _without_token(url: str) -> str:
    return re.sub(r"token=[0-9a-f]+", "token=...", url)


def server_log_errors(log: Path | None, limit: int = 60) -> str:
    """The jupyter server's error lines ('[E ...') and what follows each (its traceback)."""
    lines = log.read_text(errors="replace").splitlines() if log and log.is_file() else []
    picked, keep = [], False
    for line in lines:
        if line.startswith("["):
            keep = line.startswith(("[E ", "[C ")) and "received signal" not in line
        if keep:
            picked.append(_without_token(line))
    return "\n".join(picked[-limit:]) or "(none)"


def _shoot(page, run: NotebookRun, path: Path, cell: int | None = None) -> None:
    """A screenshot of the page, or of one cell (scrolled into view), for failure messages."""
    try:
        if cell is None:
            page.screenshot(path=str(path))
        else:
            page.locator(CELLS).nth(cell).screenshot(path=str(path), timeout=10_000)
        run.screenshots.append(path)
    except Exception as exc:  # a screenshot is a help, never the failure
        run.screenshots.append(f"{path} (failed: {type(exc).__name__})")


def move_slider(page, lab: Lab, run: NotebookRun, shot_dir: Path) -> None:
    """Focus the first slider handle of the slider cell, press ArrowRight twice, and wait
    for its output to change; records before/after in ``run.slider``."""
    cell = page.locator(CELLS).nth(run.slider_cell)
    handle = cell.locator(".widget-slider .noUi-handle").first
    try:
        handle.wait_for(state="attached", timeout=20_000)
        handle.scroll_into_view_if_needed(timeout=10_000)
        _shoot(page, run, shot_dir / f"{run.name}.slider-before.png", cell=run.slider_cell)
        before = cell.evaluate(SLIDER_VIEW)
        run.slider["before"] = before
        handle.focus()
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        deadline = time.time() + STALL_S
        after = before
        while time.time() < deadline:
            after = cell.evaluate(SLIDER_VIEW)
            changed = (after["plots"] != before["plots"] if run.slider_kind == "figure"
                       else after["text"] != before["text"])
            if changed and (run.slider_kind == "text" or after["plots"]):
                break
            time.sleep(0.2)
        run.slider["after"] = after
        wait_until_idle(page, lab, run.name, None)
        run.slider["final"] = cell.evaluate(SLIDER_VIEW)
        _shoot(page, run, shot_dir / f"{run.name}.slider-after.png", cell=run.slider_cell)
    except Exception as exc:
        run.slider["error"] = f"{type(exc).__name__}: {exc}"
        _shoot(page, run, shot_dir / f"{run.name}.slider-error.png")


def run_notebook(browser, lab: Lab, name: str, shot_dir: Path) -> NotebookRun:
    nb_path = lab.root / name
    run = NotebookRun(name, cell_index(nb_path, r"LiveDashboard\(|live_dashboard\(|train_live\("),
                      cell_index(nb_path, r"slider_figure\("), NOTEBOOKS[name].slider,
                      log=lab.log)
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.on("console", lambda m: run.console.append(f"console.{m.type}: {m.text}")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: run.console.append(f"pageerror: {e}"))
    page.on("response", lambda r: run.server_errors.append(
        f"{r.status} {r.request.method} {_without_token(r.url)}") if r.status >= 500 else None)
    page.add_init_script(RECORDER)
    try:
        # ?reset: an empty workspace, not the layout an earlier page left behind
        open_notebook(page, f"{lab.base}/lab/tree/{name}?reset&token={lab.token}")
        before = prompts(page)
        t0 = time.time()
        run_all(page)
        try:
            wait_until_idle(page, lab, name, before)
        finally:
            run.seconds = time.time() - t0
            run.plots = page.evaluate("() => window.__bmPlots")
            run.html = page.evaluate("() => window.__bmHtml")
            run.cells = page.evaluate(MODEL_OUTPUTS)
            run.dom_errors = page.evaluate(DOM_ERRORS, CELLS)
            _shoot(page, run, shot_dir / f"{name}.after-run-all.png")
            _shoot(page, run, shot_dir / f"{name}.dashboard.png", cell=run.dashboard_cell)
        move_slider(page, lab, run, shot_dir)
        page.wait_for_timeout(500)          # late console messages
    except Exception as exc:
        _shoot(page, run, shot_dir / f"{name}.error.png")
        raise RuntimeError(f"{name}: {type(exc).__name__}: {exc}\n{run.shots()}\n"
                           f"jupyter log: {lab.log}") from exc
    finally:
        page.close()
        try:
            lab.shut_down(name)
        except OSError:
            pass
    return run


# ----------------------------------------------------------------------------- other live views

# The live views no kit notebook in NOTEBOOKS shows, fed made-up steps (a few seconds, no
# training): a comparison of two runs (notebooks 03, 05, 09, 10) and a monitor drawing a
# figure of two subplots (notebook 08's routing; a FigureWidget stayed blank on it). The
# first cell draws a figure, as every notebook does before it trains: plotly.js is loaded.
LIVE_VIEWS = "live_views.ipynb"
LIVE_STEPS = 40
FEED = f"""import time

import numpy as np

from blockmem_lite import viz

rng = np.random.default_rng(0)


def feed(callback, total={LIVE_STEPS}, seconds=6.0):
    \"\"\"A made-up run of `total` steps in `seconds`, as the Trainer sends it.\"\"\"
    for step in range(1, total + 1):
        time.sleep(seconds / total)
        callback.on_step(None, dict(step=step, total_steps=total, loss=5 - step / total,
                                    tokens_per_s=1000.0 + step, memory_bytes=2**20 * (300 + step),
                                    memory_method="process_rss", elapsed_s=step * seconds / total))
        if step % 10 == 0:
            callback.on_eval(None, dict(step=step, val_loss=5.1 - step / total))
    callback.on_end(None, dict(step=list(range(1, total + 1))))


viz.bar_compare({{"a": 1.0, "b": 2.0}})"""
COMPARE = """live = viz.LiveComparison(runs=["a", "b"], total_steps=40, title="two runs")
feed(live.run("a"))
feed(live.run("b"))"""
MONITOR = """monitor = viz.LiveMonitor(
    probe=lambda trainer, rec: {"heat": rng.random((8, 5)), "share": rng.random(5)},
    figure=lambda snap: viz.routing_heatmap(snap["heat"], snap["share"]), every=2,
    title="routing")
feed(monitor)"""


@dataclass
class LiveRun:
    """What the LIVE_VIEWS notebook drew and logged."""

    plots: list
    html: list
    console: list
    shots: list


def run_live_views(browser, lab: Lab, shot_dir: Path) -> LiveRun:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[new_code_cell(FEED), new_code_cell(COMPARE),
                             new_code_cell(MONITOR)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, str(lab.root / LIVE_VIEWS))
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    console = []
    page.on("console", lambda m: console.append(f"console.{m.type}: {m.text}")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    page.add_init_script(RECORDER)
    shot = shot_dir / f"{LIVE_VIEWS}.png"
    try:
        open_notebook(page, f"{lab.base}/lab/tree/{LIVE_VIEWS}?reset&token={lab.token}")
        before = prompts(page)
        run_all(page)
        wait_until_idle(page, lab, LIVE_VIEWS, before)
        page.screenshot(path=str(shot), full_page=True)
        return LiveRun(page.evaluate("() => window.__bmPlots"),
                       page.evaluate("() => window.__bmHtml"), console, [shot])
    except Exception as exc:
        page.screenshot(path=str(shot))
        raise RuntimeError(f"{LIVE_VIEWS}: {type(exc).__name__}: {exc}; screenshot {shot}; "
                           f"jupyter log: {lab.log}") from exc
    finally:
        page.close()
        lab.shut_down(LIVE_VIEWS)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def browser():
    executable = find_chromium()
    if executable is None and os.environ.get(CHROMIUM_ENV):
        pytest.skip(f"no Chromium: {CHROMIUM_ENV}={os.environ[CHROMIUM_ENV]!r} is not a file "
                    "or a command on PATH")
    if executable is None:
        pytest.skip(f"no Chromium found: none of {', '.join(CHROMIUM_NAMES)} on PATH and "
                    f"{CHROMIUM_ENV} unset (on Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (pip install playwright; "
                                          "no `playwright install` needed: the system Chromium "
                                          "is used)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def lab(browser, tmp_path_factory):
    work = tmp_path_factory.mktemp("browser")
    server = start_lab(work)
    try:
        yield server
    finally:
        stop_lab(server.proc)


@pytest.fixture(scope="module", params=list(NOTEBOOKS), ids=[Path(n).stem for n in NOTEBOOKS])
def ran(request, browser, lab):
    return run_notebook(browser, lab, request.param, lab.root.parent)


@pytest.fixture(scope="module")
def live_views(browser, lab):
    return run_live_views(browser, lab, lab.root.parent)


# ----------------------------------------------------------------------------- the tests

ROWS = {"y": "loss", "y2": "tokens/s", "y3": "memory"}
MIN_LIVE_REDRAWS = 3


def _cell_states(run, cell: int) -> list[dict]:
    """The recorded states of the figures drawn in ``cell``, in time order. Each redraw of a
    live chart may be a new plot element (recorded apart), and at the end the last figure
    replaces the widget as a plain output; the states of every element are merged, and the
    one that ends with the most points (the one on show) ends the list, so its final
    state is the chart as it stays."""
    views = [p["states"] for p in run.plots if p["states"] and p["states"][0]["cell"] == cell]
    if not views:
        return []
    last = max(views, key=lambda states: (sum(tr["n"] for tr in states[-1]["traces"]),
                                          states[-1]["t"]))
    earlier = [s for states in views if states is not last for s in states]
    return sorted(earlier, key=lambda s: s["t"]) + last


def _dashboard_states(run: NotebookRun) -> list[dict]:
    return _cell_states(run, run.dashboard_cell)


def _rows(state: dict) -> dict[str, int]:
    """Points per row (the most any trace of that y axis has): loss, tokens/s, memory."""
    rows = dict.fromkeys(ROWS.values(), 0)
    for tr in state["traces"]:
        if tr["yaxis"] in ROWS:
            rows[ROWS[tr["yaxis"]]] = max(rows[ROWS[tr["yaxis"]]], tr["n"])
    return rows


def _in_progress(text: str | None) -> bool:
    """Title and status line say 'step 20/300 · about 8 s left ...' while training, then
    'done: ...' (a monitor's title: 'routing: step 20/40' until 'step 40/40')."""
    text = text or ""
    steps = re.search(r"step (\d+)/(\d+)", text)
    return bool(steps) and int(steps.group(1)) < int(steps.group(2)) \
        and "done" not in text and "interrupted" not in text


def _summary(states: list[dict]) -> str:
    """The first and last few recorded states, for a failure message."""
    def one(s):
        return f"{s['t'] / 1000:.2f}s {_rows(s)} {(s['title'] or '')[-45:]!r}"
    shown = [one(s) for s in states[:3]]
    if len(states) > 6:
        shown.append("...")
    shown += [one(s) for s in states[max(3, len(states) - 3):]]
    return "; ".join(shown) or "none"


def test_live_dashboard_renders_and_grows_while_training(ran):
    """The dashboard's chart is drawn in a widget, its three rows gain points across at
    least MIN_LIVE_REDRAWS redraws made while training ran, on one step axis 0..total."""
    states = _dashboard_states(ran)
    where = f"{ran.name}, dashboard in cell {ran.dashboard_cell}; {ran.shots()}"
    drawn = sorted({p["states"][0]["cell"] for p in ran.plots if p["states"]})
    assert any(s["inWidget"] for s in states), (
        f"no plotly chart was drawn inside a widget in the dashboard cell ({where}); charts "
        f"were drawn in cells {drawn}")
    final = states[-1]
    assert all(n > 0 for n in _rows(final).values()), (
        f"each of the dashboard's three rows should have points at the end, got "
        f"{_rows(final)} ({where})")
    assert final["svgPoints"] > 0, f"the dashboard drew no line ({where})"
    total = int(re.search(r"step \d+/(\d+)", final["title"] or "step 0/0").group(1))
    assert total and all(r == [0, total] for r in final["xRanges"]), (
        f"the three rows should share the step axis 0..{total}: x ranges {final['xRanges']} "
        f"({where})")
    assert re.match(r"MiB \((?!no reading).+\)", final["memoryAxis"] or ""), (
        f"the memory row's axis should name how memory was read, got "
        f"{final['memoryAxis']!r} ({where})")
    live = [s for s in states if _in_progress(s["title"]) and _rows(s)["loss"] > 0
            and s["inWidget"]]
    assert len(live) >= MIN_LIVE_REDRAWS, (
        f"expected at least {MIN_LIVE_REDRAWS} redraws of the dashboard while it trained, saw "
        f"{len(live)} ({where}); states: {_summary(states)}")
    first, last = _rows(live[0]), _rows(live[-1])
    assert all(last[row] > first[row] for row in ROWS.values()), (
        f"every row should gain points while training: first {first}, last {last} ({where})")
    assert live[-1]["svgPoints"] > live[0]["svgPoints"], (
        f"the drawn lines should gain points while training ({where}): "
        f"{live[0]['svgPoints']} -> {live[-1]['svgPoints']}")
    status = [h["text"] for h in ran.html if h["cell"] == ran.dashboard_cell]
    assert sum(_in_progress(t) for t in status) >= 2 and "done" in (status or [""])[-1], (
        f"the status line above the chart should change while training and end with 'done' "
        f"({where}): {status[:2]} ... {status[-1:]}")


def test_slider_changes_its_output(ran):
    """ArrowRight twice on the first slider's handle: the readout moves, the figure (or the
    printed text) under it changes, and the slider's label is shown whole."""
    s = ran.slider
    where = f"{ran.name}, slider in cell {ran.slider_cell}; {ran.shots()}"
    assert "error" not in s, f"moving the slider failed: {s['error']} ({where})"
    before, final = s["before"], s["final"]
    assert before["sliders"] >= 1, f"no slider handle rendered ({where})"
    assert before["labels"] and all(lab and lab["text"] for lab in before["labels"]), (
        f"every slider should have its label beside it: {before['labels']} ({where})")
    clipped = [lab["text"] for lab in before["labels"] if lab["clipped"]]
    assert not clipped, f"slider labels cut off: {clipped} ({where})"
    assert final["readout"] != before["readout"], (
        f"the slider's readout did not move from {before['readout']!r} ({where})")
    moved = f"{before['readout']} -> {final['readout']}"
    if ran.slider_kind == "figure":
        assert before["plots"] and final["plots"], f"no figure under the slider ({where})"
        assert final["plots"] != before["plots"], (
            f"the figure did not change when the slider moved {moved} ({where})")
    else:
        assert final["text"] != before["text"], (
            f"the printed output did not change when the slider moved {moved} ({where}): "
            f"{before['text']!r}")
    assert final["text"] or final["plots"], f"the slider's output is empty ({where})"


def test_no_error_outputs(ran):
    """No error output, no stderr traceback, no widget that failed to show; every code cell
    ran (Run All stops at the first error)."""
    where = f"{ran.name}; {ran.shots()}"
    errors = [f"cell {c['index']}: {o['ename']}: {o['evalue']}"
              for c in ran.cells for o in c["outputs"] if o["type"] == "error"]
    errors += [f"cell {c['index']}: stderr with a traceback: {o['text'][-300:]!r}"
               for c in ran.cells for o in c["outputs"] if o["type"] == "stream"
               and o["name"] == "stderr" and "Traceback" in (o["text"] or "")]
    errors += [f"cell {e['index']} shows: {e['text'][:300]!r}" for e in ran.dom_errors]
    assert not errors, f"error outputs ({where}):\n" + "\n".join(errors)
    not_run = [c["index"] for c in ran.cells if c["type"] == "code" and c["count"] is None]
    assert not not_run, f"code cells that did not run: {not_run} ({where})"


def test_no_console_errors(ran):
    """Nothing in the browser console at level error, and no uncaught page error, from
    opening the notebook to after the slider moved."""
    errors = [line for line in ran.console
              if not any(re.search(pattern, line) for pattern, _why in CONSOLE_ALLOW)]
    assert not errors, (f"{ran.name}: the browser console logged errors ({ran.shots()}):\n"
                        + "\n".join(errors) + "\nresponses with a 5xx status: "
                        + ("; ".join(ran.server_errors) or "none")
                        + f"\nserver log errors ({ran.log}):\n{server_log_errors(ran.log)}")


def test_the_server_answered_every_request(ran):
    """No request of the page got a 5xx answer (a real server error, e.g. one that only
    load exposes); the failure shows the server log's errors and tracebacks."""
    assert not ran.server_errors, (
        f"{ran.name}: the jupyter server answered with an error: "
        + "; ".join(ran.server_errors) + f"\nserver log errors ({ran.log}):\n"
        + server_log_errors(ran.log))


def _mid_run(states: list[dict]) -> list[dict]:
    """The states drawn in a widget while the view still said it was running."""
    return [s for s in states if s["inWidget"] and _in_progress(s["title"])]


def test_a_live_comparison_draws_both_runs_while_they_train(live_views):
    """Read from the plotly element while the cell ran: the chart of two runs (5 traces
    each) gained points across redraws, and the second run drew while the first stayed."""
    states = _cell_states(live_views, 1)
    where = f"{LIVE_VIEWS} cell 1; screenshot {live_views.shots[0]}"
    mid = _mid_run(states)
    assert len(mid) >= MIN_LIVE_REDRAWS, (
        f"expected {MIN_LIVE_REDRAWS} redraws of the comparison while it ran, saw {len(mid)} "
        f"({where}); states: {_summary(states)}")
    points = [[tr["n"] for tr in s["traces"]] for s in mid]
    assert all(len(p) == 10 for p in points), (where, points[:3])
    assert points[-1][0] > points[0][0] or points[-1][5] > points[0][5], (where, points)
    assert any(p[0] == LIVE_STEPS and 0 < p[5] < LIVE_STEPS for p in points), (
        f"no redraw showed run b training after run a ({where}): {points}")
    final = [tr["n"] for tr in states[-1]["traces"]]
    assert final[0] == final[5] == LIVE_STEPS, (where, final)
    status = [h["text"] for h in live_views.html if h["cell"] == 1]
    assert sum(_in_progress(t) for t in status) >= 2 and "done" in status[-1], (
        where, status[:2], status[-1:])


def test_a_live_monitor_draws_a_figure_of_subplots_while_it_runs(live_views):
    """The monitor's heatmap and bars (x/y and x2/y2) are drawn with both their axes while
    the cell runs, and nothing is logged (a FigureWidget logged 'cannot set xaxis2.anchor
    and a parent attribute simultaneously' and stayed blank)."""
    states = _cell_states(live_views, 2)
    where = f"{LIVE_VIEWS} cell 2; screenshot {live_views.shots[0]}"
    mid = _mid_run(states)
    assert len(mid) >= MIN_LIVE_REDRAWS, (where, _summary(states))
    assert all(len(s["traces"]) == 2 and all(tr["n"] > 0 for tr in s["traces"]) for s in mid), \
        (where, [s["traces"] for s in mid[:3]])
    assert all({"xaxis2", "yaxis2"} <= set(s["axes"]) for s in mid), (where, mid[0]["axes"])
    assert re.search(rf"step {LIVE_STEPS}/{LIVE_STEPS}", states[-1]["title"] or ""), where
    assert live_views.console == [], f"{where}:\n" + "\n".join(live_views.console)
