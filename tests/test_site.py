"""The static site: every notebook executed headless, exported with interactive figures,
an index with the notebook map; a failing cell stops the build and names the notebook."""

import re
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


def test_a_failing_cell_stops_the_build_and_names_the_notebook(tmp_path):
    root = tmp_path / "notebooks"
    _write(root, "01_broken.ipynb", [new_code_cell("raise ValueError('planted')")])
    with pytest.raises(site.SiteError, match="(?s)01_broken.ipynb: a cell failed.*ValueError: planted"):
        site.build(tmp_path / "site", root=root, log=lambda line: None)
    assert not (tmp_path / "site" / "01_broken.html").exists()


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
