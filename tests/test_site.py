"""The static site: every notebook executed headless, exported with interactive figures,
an index with the notebook map; a notebook that fails is marked, never dropped. In
Chromium (skipped without it or playwright): every equation renders, no page requests
anything but its own files, no link leads to a missing page."""

import html
import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from blockmem_lite import viz
from blockmem_lite.tools import site
from blockmem_lite.tools.exercises import notebooks_dir

NOTEBOOKS = sorted(notebooks_dir().glob("[0-9][0-9]_*.ipynb"))
# a cell that draws: a call of a viz figure builder or of the lab's figures
_BUILDERS = [name for module in ("charts", "mechanisms", "training", "bench")
             for name in viz._HOMES[module] if name != "update_training_panels"]
FIGURE_CALL = re.compile(rf"\b(viz\.({'|'.join(_BUILDERS)})|lab_figures\.\w+)\(")


def _write(root: Path, name: str, cells) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, str(root / name))
    return root / name


FIGURE = ("import plotly.graph_objects as go\n"
          "go.Figure(go.Scatter(x=[1, 2], y=[3, 4], name='line'))")


def test_a_small_site_has_pages_figures_index_and_offline_assets(tmp_path):
    root = tmp_path / "notebooks"
    _write(root, "01_first.ipynb", [new_markdown_cell("# 01 · First\nWith $x^2$."),
                                    new_code_cell(FIGURE), new_code_cell("print('hi')")])
    _write(root, "02_second.ipynb", [new_markdown_cell("# 02 · Second"),
                                     new_code_cell("1 + 1")])
    (root.parent / "README.md").write_text(
        "| # | notebook | what |\n|---|---|---|\n"
        "| 01 | [first](notebooks/01_first.ipynb) | the **first** one |\n")
    out = tmp_path / "site"
    lines = []
    pages = site.build(out, root=root, log=lines.append)
    assert [(p.html_name, p.title, p.figures) for p in pages] == [
        ("01_first.html", "01 · First", 1), ("02_second.html", "02 · Second", 0)]
    first = (out / "01_first.html").read_text()
    assert first.count('class="blockmem-figure"') == 1 and "Plotly.newPlot" in first
    assert first.index(site.PLOTLY_ASSET) < first.index("Plotly.newPlot")
    assert "require.min.js" not in first, "require.js would hide Plotly"
    assert "application/vnd.plotly.v1+json" not in first
    assert 'href="index.html"' in first
    index = (out / "index.html").read_text()
    assert 'href="01_first.html"' in index and 'href="02_second.html"' in index
    assert "<strong>first</strong>" in index and "fast" in index
    assert (out / site.PLOTLY_ASSET).stat().st_size > 1_000_000
    assert "[1/2]" in lines[0] and "open" in lines[-1]


# --- a small site: maths, links, a figure, a widget, and a notebook that fails ---------------

MATHS = r"""# 01 · Maths and links
Inline $W_{ij}$, $v'$ and $\mathbb{R}^d$, and the case the vendored MathJax failed on:
$$
W_{ij} = \begin{cases} \alpha^{\,i-j} / \sum_{j' \le i} \alpha^{\,i-j'} & j \le i \\
0 & j > i \end{cases}
$$
See [the next notebook](02_second.ipynb#Part), [the papers](../docs/PAPERS.md#armt-equations),
[the exercises](exercises/), [the worked answers](solutions/01_maths.ipynb), [the
web](https://example.org/x) and ![a diagram](figures/d.svg)."""
# a working copy JupyterLab saved: its widget state (a FigureWidget's is megabytes)
SAVED_WIDGETS = {"application/vnd.jupyter.widget-state+json": {
    "state": {"m": {"model_name": "AnyModel", "state": {"_esm": "x" * 50_000}}},
    "version_major": 2, "version_minor": 0}}


@pytest.fixture(scope="module")
def small_site(tmp_path_factory):
    """01 (maths, links, a figure, a widget, saved widget state), 02, 03 (a cell raises)."""
    base = tmp_path_factory.mktemp("small")
    root = base / "notebooks"
    (root / "figures").mkdir(parents=True)
    (root / "figures" / "d.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg"/>')
    first = _write(root, "01_maths.ipynb", [
        new_markdown_cell(MATHS), new_code_cell(FIGURE),
        new_code_cell("import ipywidgets\nipywidgets.IntSlider(3)")])
    nb = nbformat.read(str(first), 4)
    nb.metadata["widgets"] = SAVED_WIDGETS
    nbformat.write(nb, str(first))
    _write(root, "02_second.ipynb", [new_markdown_cell("# 02 · Second\n## Part\nBack to "
                                                       "[the first](01_maths.ipynb).")])
    _write(root, "03_broken.ipynb", [new_markdown_cell("# 03 · Broken"),
                                     new_code_cell("raise ValueError('planted')")])
    (base / "README.md").write_text("| # | notebook | what |\n|---|---|---|\n"
                                    "| 01 | [m](notebooks/01_maths.ipynb) | see [docs](docs/X.md) |\n")
    lines = []
    with pytest.raises(site.SiteError) as failed:
        site.build(base / "site", root=root, log=lines.append)
    return base / "site", str(failed.value), lines


def test_a_failing_notebook_is_marked_in_the_index_and_named_last(small_site):
    out, error, lines = small_site
    reason = "cell 1 (\"raise ValueError('planted')\") raised ValueError: planted"
    assert error.splitlines()[-1] == f"1 of 3 notebooks have no page: 03_broken.ipynb: {reason}"
    assert "Traceback" not in error.splitlines()[-1]
    assert lines[-1].startswith("site: 2 of 3 pages in")
    index = (out / "index.html").read_text()
    for name in ("01_maths", "02_second", "03_broken"):
        assert f'href="{name}.html"' in index
    assert '<tr class="failed">' in index and "1 of 3 notebooks failed to build" in index
    assert "Not built:</b> " + html.escape(reason) in index
    page = (out / "03_broken.html").read_text()
    assert "This page was not built" in page and "notebooks/03_broken.ipynb" in page
    assert "Traceback" not in page


def test_pages_keep_no_widget_state_and_no_cdn_script(small_site):
    out, _, _ = small_site
    page = (out / "01_maths.html").read_text()
    assert "widget-state" not in page and "x" * 1000 not in page and len(page) < 1_000_000
    assert site.WIDGET_NOTE in page
    assert not re.findall(r'(?:src|import\()\s*=?\s*["\']https?://', page), "a CDN script"
    assert 'href="02_second.html#Part"' in page
    assert "(<code>docs/PAPERS.md#armt-equations</code>)" in page
    assert "(<code>notebooks/exercises/</code>)" in page
    assert 'href="https://example.org/x"' in page and 'src="figures/d.svg"' in page
    assert "(<code>docs/X.md</code>)" in (out / "index.html").read_text()


def test_bad_arguments_are_clear_errors(tmp_path, capsys):
    assert site.main(["--notebook", "99", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--notebook 99 is not allowed: expected one of 00, 01" in err
    with pytest.raises(SystemExit):
        site.main(["--preset", "huge"])
    assert "invalid choice: 'huge'" in capsys.readouterr().err


# Built in the test: a notebook of figures by hand, one of a trained model's figures and
# the lab's, one of live widgets. Every notebook runs under nbval already; building all
# twelve again here cost CI about 5 minutes, so the full build is `make site`'s own run.
SAMPLE = ("01", "05", "08")


def test_a_full_site_takes_every_notebook_in_order():
    assert site.site_notebooks(notebooks_dir(), False, None) == NOTEBOOKS
    assert len(site.site_notebooks(notebooks_dir(), True, None)) == 2 * len(NOTEBOOKS) - 1


@pytest.fixture(scope="module")
def fast_site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    return out, site.build(out, "fast", only=list(SAMPLE), log=lambda line: None)


def test_the_fast_site_pages_have_their_figures_and_no_errors(fast_site):
    out, pages = fast_site
    assert [p.source for p in pages] == [p for p in NOTEBOOKS if p.name[:2] in SAMPLE]
    index = (out / "index.html").read_text()
    for page in pages:
        text = (out / page.html_name).read_text()
        assert f'href="{page.html_name}"' in index
        assert "Traceback (most recent call last)" not in text, page.html_name
        assert 'data-mime-type="application/vnd.jupyter.stderr"' not in text or \
            "Error" not in re.sub(r"<[^>]+>", "", text.split("jupyter.stderr", 1)[1])[:2000], \
            page.html_name
        plots = sum(bool(FIGURE_CALL.search("".join(c.source)))
                    for c in nbformat.read(str(page.source), 4).cells)
        if plots:
            assert page.figures >= 1, f"{page.html_name}: no interactive figure"
            assert text.count('class="blockmem-figure"') == page.figures
    assert (out / "figures").is_dir() == (notebooks_dir() / "figures").is_dir()


# --- in Chromium ------------------------------------------------------------------------------

LOCAL = ("file:", "data:", "about:", "blob:")
# MathJax_Blank, MathJax's font-loading probe, is an empty data: URL (site.MATHJAX_CONFIG);
# Chromium warns that it is no font, as it does over http for MathJax's about:blank.
CONSOLE_ALLOW = ("Failed to decode downloaded font: data:,",)
LOOK = """() => ({
  errors: [...document.querySelectorAll('.MathJax_Error, .merror, mjx-merror')]
    .map(e => e.textContent.slice(0, 120)),
  processing: (document.body.innerText.match(/Math Processing Error/g) || []).length,
  formulas: document.querySelectorAll('.MathJax, .MathJax_Display').length,
  unrendered: document.querySelectorAll('.MathJax_Preview:not(:empty)').length,
  links: [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
  images: [...document.querySelectorAll('img[src]')].map(i => i.getAttribute('src')),
})"""


@pytest.fixture(scope="module")
def chromium():
    executable = os.environ.get("BLOCKMEM_CHROMIUM") or next(
        filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if executable is None:
        pytest.skip("no Chromium (chromium, chromium-browser or google-chrome on PATH)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True,
                                    args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


def look(browser, page_path: Path) -> dict:
    """Open the page from disk, let MathJax typeset every formula, and report what it drew,
    what it asked for and what it logged."""
    page = browser.new_page()
    asked, failed, console = [], [], []
    page.on("request", lambda r: asked.append(r.url))
    page.on("requestfailed", lambda r: failed.append(r.url))
    page.on("console", lambda m: console.append(m.text) if m.type in ("error", "warning")
            and not m.text.startswith(CONSOLE_ALLOW) else None)
    try:
        page.goto(page_path.as_uri(), wait_until="load")
        if page.evaluate("() => !!window.MathJax"):
            page.wait_for_function("() => MathJax.isReady === true", timeout=60_000)
            page.evaluate("() => new Promise(done => MathJax.Hub.Queue(() => done(true)))")
        seen = page.evaluate(LOOK)
    finally:
        page.close()
    seen.update(remote=[u for u in asked if not u.startswith(LOCAL)], failed=failed,
                console=console)
    return seen


def missing_targets(out: Path, seen: dict, also: set[str] = frozenset()) -> list[str]:
    """The page's relative links and images whose file is not in the site (nor in ``also``)."""
    targets = [h.split("#")[0] for h in seen["links"] + seen["images"]
               if not re.match(r"^(?:[a-z][a-z0-9+.-]*:|#)", h)]
    return [t for t in targets if t not in also and not (out / t).is_file()]


@pytest.mark.browser
def test_the_small_site_in_chromium_renders_every_formula_offline_without_dead_links(
        small_site, chromium):
    out, _, _ = small_site
    for page in sorted(out.glob("*.html")):
        seen = look(chromium, page)
        where = page.name
        assert not seen["errors"] and not seen["processing"], (where, seen["errors"])
        assert not seen["unrendered"], where
        assert seen["remote"] == [] and seen["failed"] == [], (where, seen)
        assert missing_targets(out, seen) == [], where
        assert seen["console"] == [], (where, seen["console"])
        if page.name == "01_maths.html":
            assert seen["formulas"] >= 4


@pytest.mark.browser
def test_every_equation_and_link_of_the_course_renders_offline(tmp_path, chromium):
    """Every markdown cell of the teaching notebooks on one page (not executed: the maths
    and the links are in the markdown), typeset by the MathJax the site ships."""
    root = notebooks_dir()
    repo = root.parent
    links = site.Links({site._in_repo(p, repo): site.page_name(p) for p in NOTEBOOKS},
                       {site._in_repo(root / "figures", repo): "figures"}, "notebooks")
    cells = [new_markdown_cell(c.source) for p in NOTEBOOKS
             for c in nbformat.read(str(p), 4).cells if c.cell_type == "markdown"]
    page = tmp_path / "course.html"
    mathjax = site._copy_assets(root, tmp_path, log=lambda line: None)
    page.write_text(site.to_html(new_notebook(cells=cells), "course", mathjax, links))
    seen = look(chromium, page)
    assert not seen["errors"] and not seen["processing"], seen["errors"]
    assert not seen["unrendered"] and seen["formulas"] > 100
    assert seen["remote"] == [] and seen["failed"] == [] and seen["console"] == [], seen
    pages = {site.page_name(p) for p in NOTEBOOKS} | {"index.html"}
    assert missing_targets(tmp_path, seen, also=pages) == []
