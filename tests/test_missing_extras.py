"""An optional extra that is not installed is one clear line naming the extra to install."""

import sys
import types

import pytest

from blockmem_lite.corpora import CorpusUnavailable, load_corpus


def test_wikitext_without_datasets_names_the_data_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)         # import datasets: not found
    with pytest.raises(CorpusUnavailable) as info:
        load_corpus("wikitext-2")
    message = str(info.value)
    assert "\n" not in message and message.startswith("wikitext-2: Hugging Face `datasets` is "
                                                      "not installed")
    assert "pip install 'blockmem_lite[data]'" in message and "allow_fallback=True" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # one traceback
    with pytest.warns(UserWarning, match=r"blockmem_lite\[data\]"):
        assert load_corpus("wikitext-2", allow_fallback=True).name == "offline"


def test_a_broken_datasets_is_not_called_missing(monkeypatch):
    """datasets is installed but one of its own dependencies is not: say that one."""
    broken = types.ModuleType("datasets")

    def lacks_pyarrow(name):
        raise ModuleNotFoundError("No module named 'pyarrow'", name="pyarrow")

    broken.__getattr__ = lacks_pyarrow
    monkeypatch.setitem(sys.modules, "datasets", broken)
    with pytest.raises(CorpusUnavailable) as info:
        load_corpus("wikitext-2")
    assert "not installed" not in str(info.value) and "pyarrow" in str(info.value)
