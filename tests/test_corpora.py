"""Corpora: offline default, WikiText through `datasets` (local parquet copy, offline
fallback), local text files, packing, the train/val split and the loaders."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from blockmem_lite import preset
from blockmem_lite.corpora import (
    Corpus,
    CorpusUnavailable,
    LMWindows,
    _one_thread_worker,
    _worker_options,
    cache_dir,
    corpus_windows,
    encode,
    load_corpus,
    longrange_text,
    make_loaders,
    pack_windows,
    split_windows,
)

OFFLINE_VARS = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")


@pytest.fixture
def hf_offline(monkeypatch, tmp_path):
    """Offline Hugging Face, and an empty kit cache in tmp_path (never the real data/ dir)."""
    datasets = pytest.importorskip("datasets")
    import huggingface_hub

    for var in OFFLINE_VARS:
        monkeypatch.setenv(var, "1")
    # datasets and huggingface_hub read the variables when first imported; set their flags too
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("BLOCKMEM_DATA", str(tmp_path / "data"))
    return tmp_path


# --- the offline corpora -------------------------------------------------------------------
def test_offline_default_loads_without_network_or_datasets():
    code = ("import sys, blockmem_lite.corpora as c\n"
            "k = c.load_corpus()\n"
            "assert k.name == 'offline' and len(k.text) > 100_000, k\n"
            "assert len(c.load_corpus('longrange').text) > 100_000\n"
            "assert 'datasets' not in sys.modules, 'datasets was imported'\n"
            "print(k.source)")
    env = {**os.environ, **{var: "1" for var in OFFLINE_VARS}}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "pydoc_data" in done.stdout


def test_offline_corpus_is_the_pydoc_topics(monkeypatch):
    for var in OFFLINE_VARS:
        monkeypatch.setenv(var, "1")
    from pydoc_data.topics import topics

    corpus = load_corpus()
    assert corpus.name == "offline"
    assert topics["assert"] in corpus.text and topics["yield"] in corpus.text
    assert "Python Software Foundation" in corpus.source
    assert load_corpus("pydoc").text == corpus.text
    assert load_corpus("pydoc").name == "pydoc"
    assert load_corpus(max_chars=1000).text == corpus.text[:1000]


def test_longrange_is_deterministic_and_asks_about_facts_far_back():
    text = longrange_text(20_000, seed=3)
    assert text == longrange_text(20_000, seed=3)
    assert text != longrange_text(20_000, seed=4)
    assert len(text) >= 20_000
    facts = re.findall(r"The door code of ([A-Za-z ]+) is (\d{4})\.", text)
    assert len(facts) >= 5
    for name, code in facts:
        stated = text.index(f"The door code of {name} is {code}.")
        asked = text.index(f"What is the door code of {name}? It is {code}.", stated)
        assert asked - stated > 500                    # the answer lies far after the fact
    assert load_corpus("longrange").name == "longrange"


# --- WikiText through datasets ----------------------------------------------------------------
WIKI_ROWS = {
    "train": ["", " = Valkyria Chronicles III = \n", "", " Senjō no Valkyria 3 : naïve .\n",
              " = = Gameplay = = \n"],
    "validation": ["", " = Robert Boulter = \n", " He is an actor .\n"],
    "test": ["", " = Homarus = \n", " A lobster .\n"],
}


def _write_wikitext_parquet(root, config):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / config
    folder.mkdir(parents=True)
    for split, rows in WIKI_ROWS.items():
        pq.write_table(pa.table({"text": rows}), folder / f"{split}-00000-of-00001.parquet")
    return folder


def _as_text(rows):
    return "".join(row or "\n" for row in rows)


@pytest.mark.parametrize("name,config", [("wikitext-2", "wikitext-2-raw-v1"),
                                         ("wikitext-103", "wikitext-103-raw-v1")])
def test_wikitext_from_a_local_parquet_copy(hf_offline, name, config):
    root = hf_offline / "wikitext"
    folder = _write_wikitext_parquet(root, config)
    corpus = load_corpus(name, local_path=root)
    assert corpus.name == name
    assert corpus.text == _as_text(WIKI_ROWS["train"])
    assert corpus.text.startswith("\n = Valkyria Chronicles III = \n\n Senjō")
    assert sorted(corpus.splits) == ["test", "validation"]
    assert corpus.splits["validation"] == _as_text(WIKI_ROWS["validation"])
    assert corpus.splits["test"] == _as_text(WIKI_ROWS["test"])
    assert config in corpus.source and "CC BY-SA" in corpus.source
    # pointing straight at the config folder works too
    assert load_corpus(name, local_path=folder).text == corpus.text
    # the prepared dataset went to the kit cache, not the user's home
    assert any(cache_dir().iterdir())
    assert str(hf_offline) in str(cache_dir())


def test_wikitext_local_copy_missing_a_split_names_the_layout(hf_offline):
    folder = _write_wikitext_parquet(hf_offline, "wikitext-2-raw-v1")
    (folder / "test-00000-of-00001.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=r"test.*wikitext-2-raw-v1/<split>-\*\.parquet"):
        load_corpus("wikitext-2", local_path=hf_offline)


def test_wikitext_offline_raises_or_falls_back(hf_offline):
    with pytest.raises(CorpusUnavailable, match="allow_fallback=True") as info:
        load_corpus("wikitext-2")
    message = str(info.value)
    assert "offline" in message and "local_path" in message and "once with network" in message
    with pytest.warns(UserWarning, match="offline corpus"):
        corpus = load_corpus("wikitext-103", allow_fallback=True)
    assert corpus.name == "offline"
    assert corpus.source.startswith("fallback for wikitext-103")
    assert corpus.text == load_corpus("offline").text


def test_files_corpus_reads_local_text_files(hf_offline):
    first = hf_offline / "a.txt"
    second = hf_offline / "b.txt"
    first.write_text("first line\n\nsecond line\n", encoding="utf-8")
    second.write_text("third line, no newline at the end", encoding="utf-8")
    corpus = load_corpus("files", paths=[first, second])
    assert corpus.text == "first line\n\nsecond line\nthird line, no newline at the end\n"
    assert corpus.name == "files" and "a.txt" in corpus.source
    assert load_corpus("files", paths=str(first)).text == "first line\n\nsecond line\n"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_corpus("files", paths=[hf_offline / "nope.txt"])
    with pytest.raises(ValueError, match="paths=None"):
        load_corpus("files")


def test_bad_corpus_arguments_name_the_parameter():
    with pytest.raises(ValueError, match=r"name='wiki'.*offline, pydoc, longrange"):
        load_corpus("wiki")
    with pytest.raises(ValueError, match="max_chars=0"):
        load_corpus(max_chars=0)
    with pytest.raises(ValueError, match="paths=.*only with name='files'"):
        load_corpus("offline", paths=["x.txt"])
    with pytest.raises(ValueError, match="local_path=.*wikitext"):
        load_corpus("longrange", local_path="somewhere")


# --- tokens, windows, split ---------------------------------------------------------------------
def test_encode_is_bytes_and_pack_windows_shapes():
    ids = encode("héllo")
    assert ids.dtype == torch.long and ids.tolist() == list("héllo".encode("utf-8"))
    assert torch.equal(encode(Corpus("c", "abc", "s", "d")), encode("abc"))
    windows = pack_windows(torch.arange(103), seq_len=9)
    assert windows.shape == (10, 10)                 # 103 // 10 windows, tail dropped
    assert torch.equal(windows.flatten(), torch.arange(100))   # no overlap, no gap
    dataset = LMWindows(windows)
    x, y = dataset[3]
    assert x.shape == y.shape == (9,) and x.dtype == y.dtype == torch.long
    assert torch.equal(x, windows[3, :-1]) and torch.equal(y, windows[3, 1:])
    assert torch.equal(x[1:], y[:-1])                # y is x shifted by one
    with pytest.raises(ValueError, match="seq_len=200.*expected seq_len <= 102"):
        pack_windows(torch.arange(103), seq_len=200)
    with pytest.raises(ValueError, match="non-empty"):
        encode("")


def test_split_is_deterministic_contiguous_and_disjoint():
    windows = pack_windows(torch.arange(1000), seq_len=9)           # 100 unique windows
    train, val = split_windows(windows, 0.1)
    assert val.shape == (10, 10) and train.shape == (90, 10)
    assert torch.equal(val, windows[-10:])                            # the end of the text
    for seed in (None, 0, 5):
        a_train, a_val = split_windows(windows, 0.2, seed=seed)
        b_train, b_val = split_windows(windows, 0.2, seed=seed)
        assert torch.equal(a_train, b_train) and torch.equal(a_val, b_val)
        train_tokens, val_tokens = set(a_train.flatten().tolist()), set(a_val.flatten().tolist())
        assert not train_tokens & val_tokens
        assert len(train_tokens | val_tokens) == 1000
        first = a_val[0, 0].item() // 10
        assert torch.equal(a_val, windows[first:first + 20])         # one contiguous block
    starts = {split_windows(windows, 0.2, seed=s)[1][0, 0].item() for s in range(10)}
    assert len(starts) > 1
    with pytest.raises(ValueError, match="val_fraction=1.5"):
        split_windows(windows, 1.5)
    with pytest.raises(ValueError, match="at least 2 windows"):
        split_windows(windows[:1], 0.1)


def test_corpus_windows_use_the_sources_validation_split():
    corpus = Corpus("c", "a" * 500, "s", "d", splits={"validation": "b" * 200})
    train, val = corpus_windows(corpus, seq_len=9, val_fraction=0.1)
    assert train.shape == (50, 10) and val.shape == (20, 10)
    assert set(val.flatten().tolist()) == {ord("b")}
    assert set(train.flatten().tolist()) == {ord("a")}


# --- loaders -----------------------------------------------------------------------------------
def _first_batch(loader):
    return next(iter(loader))


def test_loaders_yield_shifted_batches_and_respect_the_seed():
    corpus = load_corpus("longrange", max_chars=30_000)
    cfg = preset("tiny", batch_size=4, val_fraction=0.1)
    train, val = make_loaders(cfg, corpus)
    x, y = _first_batch(train)
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    n_windows = len(encode(corpus)) // 33
    n_val = round(n_windows * 0.1)
    assert len(train.dataset) == n_windows - n_val and len(val.dataset) == n_val
    assert len(train) == (n_windows - n_val) // 4                     # drop_last
    vx, _ = _first_batch(val)
    assert torch.equal(vx, torch.stack([val.dataset[i][0] for i in range(4)]))  # in order
    again, _ = make_loaders(cfg, corpus)
    other, _ = make_loaders(cfg.replace(seed=1), corpus)
    assert torch.equal(_first_batch(again)[0], x)
    assert not torch.equal(_first_batch(other)[0], x)
    epoch_one, epoch_two = list(train), list(train)
    assert not torch.equal(epoch_one[0][0], epoch_two[0][0])          # reshuffled each epoch


def test_loaders_load_the_configured_corpus_by_name():
    cfg = preset("tiny", corpus="longrange")
    train, _ = make_loaders(cfg)
    assert torch.equal(train.dataset.windows[0].long(), encode(longrange_text()[:33]))


def test_loader_workers_use_one_thread_and_never_exceed_spare_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert _worker_options(0) == {"num_workers": 0}
    options = _worker_options(2)
    assert options["num_workers"] == 2 and options["worker_init_fn"] is _one_thread_worker
    with pytest.warns(UserWarning, match="num_workers=8"):
        assert _worker_options(8)["num_workers"] == 3
    before = torch.get_num_threads()
    try:
        _one_thread_worker(0)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_loader_errors_are_clear():
    small = Corpus("small", "x" * 400, "s", "d")
    with pytest.raises(ValueError, match="batch_size=16.*only 11 training windows"):
        make_loaders(preset("tiny", batch_size=16), small)
    with pytest.raises(ValueError, match="vocab_size=100"):
        make_loaders(preset("tiny", vocab_size=100), small)


def test_runs_live_in_the_checkout_or_where_the_variable_says(monkeypatch, tmp_path):
    from blockmem_lite import corpora
    monkeypatch.delenv("BLOCKMEM_RUNS", raising=False)
    assert corpora.runs_dir() == Path(corpora.__file__).resolve().parent.parent / "runs"
    monkeypatch.setenv("BLOCKMEM_RUNS", str(tmp_path / "mine"))
    assert corpora.runs_dir() == tmp_path / "mine"
