"""Text corpora, packed into fixed token windows for language-model training.

``load_corpus(name)`` knows these names:

* ``"offline"`` (the default) and its alias ``"pydoc"``: real English prose that
  ships inside Python's standard library, the pydoc topic help texts
  (``pydoc_data.topics``, about 465 KB). No network, no files, no extra package.
  The text changes a little between Python versions, so losses measured on it
  are comparable only within one Python version.
* ``"longrange"``: a generated corpus with long-range structure. Each document
  states facts about a few invented people early, then tells unrelated
  events, then asks about the facts kilobytes later; only a model that keeps
  those facts in memory can predict the answers. Deterministic from a seed.
* ``"wikitext-2"`` / ``"wikitext-103"``: WikiText (raw), through Hugging Face
  ``datasets`` from the Hub (``Salesforce/wikitext``), cached under
  ``cache_dir()``; or from a local copy of the Hub repository's parquet files
  (``local_path``). Offline and not cached: ``CorpusUnavailable``, or, with
  ``allow_fallback=True``, a warning and the offline corpus.
* ``"files"``: your own text files (``paths``, any ``encoding``), each ending in a newline.

``datasets`` is imported only inside the WikiText loaders.

Kit design choices: windows do not overlap (each holds ``seq_len + 1`` tokens,
so no token is shared between two windows and any split of windows is
disjoint); the validation set is a contiguous block of windows (held-out
text, not interleaved with training text), the end of the stream by default
and fixed across training seeds so validation losses stay comparable; when a
source has its own validation split (WikiText) that split is used.
"""

from __future__ import annotations

import os
import platform
import random
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from blockmem_lite.config import CORPUS_NAMES
from blockmem_lite.runtime import usable_workers
from blockmem_lite.tokenizer import ByteTokenizer, get_tokenizer
from blockmem_lite.validation import check_int

WIKITEXT_REPO = "Salesforce/wikitext"
WIKITEXT_CONFIGS = {"wikitext-2": "wikitext-2-raw-v1", "wikitext-103": "wikitext-103-raw-v1"}
WIKITEXT_SPLITS = ("train", "validation", "test")
_OFFLINE_ENV_VARS = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
_ENCODE_CHUNK_CHARS = 1 << 20


class CorpusUnavailable(RuntimeError):
    """The corpus is neither in the local cache nor reachable (e.g. WikiText while offline)."""


@dataclass(repr=False)
class Corpus:
    """A text corpus. ``text`` is the training text; ``splits`` holds the source's
    own held-out splits when it has them (e.g. ``{"validation": ..., "test": ...}``)."""

    name: str
    text: str
    source: str
    description: str
    splits: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.text)

    def __repr__(self) -> str:
        held_out = ", ".join(f"{k}={len(v):,}" for k, v in self.splits.items())
        extra = f", splits: {held_out}" if held_out else ""
        return (f"Corpus(name={self.name!r}, chars={len(self.text):,}{extra}, "
                f"source={self.source!r})")


# --- where data lives ------------------------------------------------------------------
def data_dir() -> Path:
    """The kit's ``data/`` folder (``$BLOCKMEM_DATA`` overrides it).

    Outside a source checkout (a plain ``pip install``) it is
    ``~/.cache/blockmem_lite``.
    """
    override = os.environ.get("BLOCKMEM_DATA")
    if override:
        return Path(override).expanduser()
    repo_root = Path(__file__).resolve().parent.parent
    if (repo_root / "pyproject.toml").is_file() and (repo_root / "data").is_dir():
        return repo_root / "data"
    return Path.home() / ".cache" / "blockmem_lite"


def runs_dir() -> Path:
    """Where notebooks keep what they train (``$BLOCKMEM_RUNS`` overrides it): the
    repository's git-ignored ``runs/`` in a source checkout, else beside ``data_dir()``.
    Never the current directory, so a notebook finds its runs wherever it is started."""
    override = os.environ.get("BLOCKMEM_RUNS")
    if override:
        return Path(override).expanduser()
    repo_root = Path(__file__).resolve().parent.parent
    if (repo_root / "pyproject.toml").is_file():
        return repo_root / "runs"
    return data_dir() / "runs"


def cache_dir() -> Path:
    """Where ``datasets`` keeps downloaded and prepared corpora: ``data_dir()/cache``."""
    path = data_dir() / "cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- loading -----------------------------------------------------------------------------
def load_corpus(name: str = "offline", *, paths=None, local_path=None,
                allow_fallback: bool = False, max_chars: int | None = None,
                encoding: str = "utf-8") -> Corpus:
    """Load a corpus by name (see the module docstring for the names).

    paths: text files for ``name="files"``, read with ``encoding`` (e.g. "latin-1"
    for older text; the command line's ``--paths`` / ``--encoding``). local_path: a folder holding the
    WikiText parquet files, laid out like the Hub repository
    (``<local_path>/wikitext-2-raw-v1/train-*.parquet`` and likewise for
    ``validation`` and ``test``; pointing straight at the config folder works too).
    allow_fallback: when WikiText cannot be had, warn and return the offline corpus.
    max_chars: keep at most this many characters of the text (and of each split).
    """
    if name not in CORPUS_NAMES:
        raise ValueError(f"name={name!r} is not allowed: expected one of {', '.join(CORPUS_NAMES)}")
    if max_chars is not None:
        check_int("max_chars", max_chars, 1)
    if paths is not None and name != "files":
        raise ValueError(f"paths={paths!r} is not allowed with name={name!r}: "
                         "paths is used only with name='files'")
    if encoding != "utf-8" and name != "files":
        raise ValueError(f"encoding={encoding!r} is not allowed with name={name!r}: "
                         "encoding is used only with name='files'")
    if local_path is not None and name not in WIKITEXT_CONFIGS:
        raise ValueError(f"local_path={local_path!r} is not allowed with name={name!r}: "
                         f"local_path is used only with {' or '.join(WIKITEXT_CONFIGS)}")
    if name in ("offline", "pydoc"):
        corpus = replace(_offline_corpus(), name=name)
    elif name == "longrange":
        corpus = longrange_corpus()
    elif name == "files":
        corpus = _files_corpus(paths, encoding)
    else:
        corpus = _wikitext_or_fallback(name, local_path, allow_fallback)
    return _truncated(corpus, max_chars)


def _truncated(corpus: Corpus, max_chars: int | None) -> Corpus:
    if max_chars is None:
        return corpus
    return replace(corpus, text=corpus.text[:max_chars],
                   splits={k: v[:max_chars] for k, v in corpus.splits.items()})


def _offline_corpus() -> Corpus:
    """The pydoc topics; the generated long-range corpus where a Python lacks pydoc_data."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        generated = longrange_corpus()
        return replace(generated, name="offline",
                       source="generated long-range corpus (this Python has no pydoc_data)")
    text = "\n\n".join(topics[key] for key in sorted(topics))
    return Corpus(
        name="offline",
        text=text,
        source=f"pydoc_data.topics of Python {platform.python_version()} (ships with CPython; "
               "Python Software Foundation License)",
        description=f"{len(topics)} pydoc help topics (the language reference in plain text), "
                    "joined in alphabetical order",
    )


def _join_lines(rows) -> str:
    """Rows of a line-based dataset back into text: every row is one line."""
    return "".join(row if row.endswith("\n") else row + "\n" for row in rows)


DATASETS_MISSING = ("Hugging Face `datasets` is not installed (WikiText needs it): "
                    "pip install 'blockmem_lite[data]'")


def _load_dataset(*args, **kwargs):
    """``datasets.load_dataset`` with the kit's cache dir; ``datasets`` imported here only."""
    try:
        from datasets import load_dataset
    except ModuleNotFoundError as err:
        if err.name != "datasets":                 # datasets is there but broken: say so
            raise
        raise ImportError(DATASETS_MISSING) from None
    return load_dataset(*args, cache_dir=str(cache_dir()), **kwargs)


def _files_corpus(paths, encoding: str = "utf-8") -> Corpus:
    if paths is None or (not isinstance(paths, (str, os.PathLike)) and len(paths) == 0):
        raise ValueError(f"paths={paths!r} is not allowed: name='files' needs a text file path "
                         "or a list of them (--paths FILE ... on the command line)")
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    try:
        "".encode(encoding)
    except LookupError:
        raise ValueError(f"encoding={encoding!r} is not allowed: not a codec Python knows "
                         "(e.g. utf-8, latin-1, cp1252)") from None
    files = [Path(p).expanduser().resolve() for p in paths]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"text files not found: {', '.join(missing)}")
    texts = [_read_text_file(f, encoding) for f in files]
    names = ", ".join(f.name for f in files)
    return Corpus(name="files", text="".join(t if t.endswith("\n") else t + "\n" for t in texts),
                  source=f"local text files: {', '.join(str(f) for f in files)}",
                  description=f"{len(files)} text file(s) ({names}), joined in the order given")


def _read_text_file(path: Path, encoding: str) -> str:
    """One file's text; a ValueError names the file and what is wrong with it."""
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"text file {path} is not usable: it is empty")
    if b"\x00" in data[:65536] and encoding.replace("-", "").lower().startswith("utf8"):
        raise ValueError(f"text file {path} is not usable: it holds NUL bytes, so it looks "
                         "binary rather than text")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as err:
        raise ValueError(f"text file {path} is not usable as {encoding}: byte "
                         f"0x{data[err.start]:02x} at offset {err.start} is not valid there; "
                         "if it is older text, read it with encoding='latin-1' (or cp1252; "
                         "--encoding on the command line)") from None


def _wikitext_or_fallback(name: str, local_path, allow_fallback: bool) -> Corpus:
    try:
        return _wikitext_corpus(name, local_path)
    except CorpusUnavailable as e:
        if not allow_fallback:
            raise
        warnings.warn(f"{e} Using the offline corpus instead (allow_fallback=True).",
                      UserWarning, stacklevel=3)
        offline = _offline_corpus()
        return replace(offline, source=f"fallback for {name} (unavailable): {offline.source}")


def _wikitext_corpus(name: str, local_path) -> Corpus:
    config = WIKITEXT_CONFIGS[name]
    if local_path is not None:
        folder, data_files = _local_parquet_files(Path(local_path).expanduser(), config)
        dataset = _load_dataset("parquet", data_files=data_files)
        source = f"local parquet copy of {WIKITEXT_REPO} ({config}) in {folder}"
    else:
        dataset = _wikitext_from_hub(name, config)
        source = f"Hugging Face Hub {WIKITEXT_REPO} ({config}), cached in {cache_dir()}"
    texts = {split: _join_lines(dataset[split]["text"]) for split in WIKITEXT_SPLITS}
    return Corpus(
        name=name, text=texts["train"], source=source + "; licence CC BY-SA",
        description=f"{name} raw: Wikipedia Good and Featured articles, one line per row; "
                    "text = train split, splits = validation and test",
        splits={"validation": texts["validation"], "test": texts["test"]},
    )


def _local_parquet_files(root: Path, config: str) -> tuple[Path, dict[str, list[str]]]:
    """The split files of a local copy: ``root/<config>/<split>-*.parquet`` (or ``root/<split>-*``)."""
    folder = root / config if (root / config).is_dir() else root
    data_files = {split: sorted(str(p) for p in folder.glob(f"{split}-*.parquet"))
                  for split in WIKITEXT_SPLITS}
    missing = [split for split, files in data_files.items() if not files]
    if missing:
        raise FileNotFoundError(
            f"local_path={str(root)!r} has no parquet files for split(s) {', '.join(missing)}: "
            f"expected {root / config}/<split>-*.parquet for splits "
            f"{', '.join(WIKITEXT_SPLITS)} (the layout of the Hub repository {WIKITEXT_REPO})")
    return folder, data_files


def _offline_env() -> bool:
    return any(os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for var in _OFFLINE_ENV_VARS)


def _wikitext_from_hub(name: str, config: str):
    try:
        return _load_dataset(WIKITEXT_REPO, config)
    except ImportError as e:
        raise CorpusUnavailable(f"{name}: {e}; or pass allow_fallback=True (--allow-fallback) "
                                "for the offline corpus") from None
    except (ConnectionError, FileNotFoundError) as e:
        raise CorpusUnavailable(_unavailable_message(name, config, e)) from e


def _unavailable_message(name: str, config: str, error: Exception) -> str:
    if _offline_env():
        why = "offline mode is on (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE)"
    else:
        why = f"the Hugging Face Hub could not be reached ({type(error).__name__})"
    return (f"{name} ({WIKITEXT_REPO}, {config}) is not in the local cache {cache_dir()} and "
            f"{why}. To get it: run load_corpus({name!r}) once with network access (it is then "
            f"cached), or download the repository's parquet files and pass "
            f"local_path=<folder holding {config}/> (--local-path on the command line). Pass "
            "allow_fallback=True (--allow-fallback) to fall back to the offline corpus.")


# --- the generated long-range corpus -----------------------------------------------------
_SYLLABLES = ("ka", "lo", "mi", "ren", "tho", "vel", "sa", "dor", "quin", "bra", "el", "ith",
              "mar", "no", "us", "zen", "fa", "gri", "hol", "pe", "tu", "wy", "xo", "cor")
_PLACE_ENDINGS = ("ford", "holm", "mere", "wick", "stead", "gate", "vale", "by")
_COLOURS = ("red", "grey", "white", "black", "golden", "spotted", "striped", "blue")
_ANIMALS = ("cat", "goat", "hound", "owl", "pony", "raven", "tortoise", "ferret")
_GOODS = ("salt", "rope", "candles", "wool", "barley", "iron nails", "honey", "paper")
_WEATHER = ("cold and wet", "bright and windy", "foggy", "hot and still", "stormy")
_MONTHS = ("March", "April", "May", "June", "July", "August", "September", "October")
_EVENTS = (
    "On {month} {day}, {who} walked to {place} to buy {goods}.",
    "The weather in {place} was {weather}, so {who} stayed at home and mended a coat.",
    "{who} wrote a long letter to {other} about the price of {goods}.",
    "A traveller from {place} told {who} a story about a bridge that fell in the night.",
    "In {month}, {who} and {other} repaired the roof of the old mill near {place}.",
    "Nobody in {place} sold {goods} that week, which annoyed {who} a great deal.",
    "{who} lent {other} a cart, and {other} returned it with a broken wheel.",
    "The market at {place} opened late because the weather was {weather}.",
)


def _invented_name(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


def _person(rng: random.Random) -> dict[str, str]:
    return {
        "name": f"{_invented_name(rng, 2)} {_invented_name(rng, rng.randint(2, 3))}",
        "home": _invented_name(rng, 2) + rng.choice(_PLACE_ENDINGS),
        "code": f"{rng.randrange(10_000):04d}",
        "pet": f"{rng.choice(_COLOURS)} {rng.choice(_ANIMALS)} called {_invented_name(rng, 2)}",
    }


def _facts(person: dict[str, str]) -> list[str]:
    name = person["name"]
    return [f"{name} lives in {person['home']}.", f"The door code of {name} is {person['code']}.",
            f"{name} keeps a {person['pet']}."]


def _questions(person: dict[str, str]) -> list[str]:
    name = person["name"]
    return [f"Where does {name} live? In {person['home']}.",
            f"What is the door code of {name}? It is {person['code']}.",
            f"What does {name} keep? A {person['pet']}."]


def _document(rng: random.Random, number: int) -> str:
    people = [_person(rng) for _ in range(rng.randint(2, 4))]
    intro = [fact for person in people for fact in _facts(person)]
    body = []
    for _ in range(rng.randint(15, 40)):
        who, other = rng.sample([p["name"] for p in people], 2)
        body.append(rng.choice(_EVENTS).format(
            who=who, other=other, day=rng.randint(4, 28), month=rng.choice(_MONTHS),
            place=_invented_name(rng, 2) + rng.choice(_PLACE_ENDINGS),
            goods=rng.choice(_GOODS), weather=rng.choice(_WEATHER)))
    questions = [q for person in people for q in _questions(person)]
    rng.shuffle(questions)
    paragraphs = [" ".join(body[i:i + 5]) for i in range(0, len(body), 5)]
    return "\n\n".join([f"= Chronicle {number} =", " ".join(intro), *paragraphs,
                        "Questions. " + " ".join(questions)]) + "\n\n"


def longrange_text(n_chars: int = 300_000, seed: int = 0) -> str:
    """Whole generated documents until at least ``n_chars`` characters (deterministic in seed).

    Each document: facts about 2-4 invented people (home, door code, pet), then
    15-40 sentences of unrelated events, then questions that repeat the facts,
    so every answer lies about 1-4 KB after the fact it needs.
    """
    check_int("n_chars", n_chars, 1)
    check_int("seed", seed, 0)
    rng = random.Random(seed)
    documents, total = [], 0
    while total < n_chars:
        documents.append(_document(rng, len(documents) + 1))
        total += len(documents[-1])
    return "".join(documents)


def longrange_corpus(n_chars: int = 300_000, seed: int = 0) -> Corpus:
    """The ``"longrange"`` corpus (see ``longrange_text``)."""
    return Corpus(
        name="longrange", text=longrange_text(n_chars, seed),
        source=f"generated by blockmem_lite.corpora.longrange_text(n_chars={n_chars}, "
               f"seed={seed})",
        description="invented chronicles: facts stated early, asked about 1-4 KB later "
                    "(long-range structure for memory mechanisms)",
    )


# --- tokens and windows -------------------------------------------------------------------
def _storage_dtype(vocab_size: int) -> torch.dtype:
    """The smallest integer dtype holding every id (WikiText-103 bytes fit in uint8)."""
    if vocab_size <= 256:
        return torch.uint8
    return torch.int16 if vocab_size <= 2**15 else torch.int32


def _text_chunks(text: str, size: int):
    """Pieces of about ``size`` characters that end at line breaks where possible."""
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            newline = text.rfind("\n", start, end)
            end = newline + 1 if newline >= start else end
        yield text[start:end]
        start = end


def _token_ids(corpus_or_text, tokenizer=None) -> torch.Tensor:
    """(N,) ids in the smallest dtype that holds the vocabulary, encoded chunk by chunk."""
    text = corpus_or_text.text if isinstance(corpus_or_text, Corpus) else corpus_or_text
    if not isinstance(text, str) or not text:
        raise ValueError(f"corpus_or_text of type {type(corpus_or_text).__name__} is not allowed: "
                         "expected a non-empty str or Corpus")
    tokenizer = tokenizer or ByteTokenizer()
    dtype = _storage_dtype(tokenizer.vocab_size)
    pieces = [tokenizer.encode_tensor(chunk).to(dtype)
              for chunk in _text_chunks(text, _ENCODE_CHUNK_CHARS)]
    return torch.cat(pieces)


def encode(corpus_or_text, tokenizer=None) -> torch.Tensor:
    """(N,) int64 token ids of a Corpus or a str (byte tokenizer by default)."""
    return _token_ids(corpus_or_text, tokenizer).long()


def pack_windows(ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(N,) ids -> (M, seq_len + 1) non-overlapping windows, M = N // (seq_len + 1).

    Row i holds x = row[:-1] and its next tokens y = row[1:]. The tail that does
    not fill a window is dropped. Same dtype as ``ids``; a view, no copy.
    """
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1:
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"ids of shape {shape} are not allowed: expected a 1-D tensor")
    check_int("seq_len", seq_len, 1)
    width = seq_len + 1
    n_windows = ids.numel() // width
    if n_windows == 0:
        raise ValueError(f"seq_len={seq_len} is not allowed: the text has only {ids.numel()} "
                         f"tokens; expected seq_len <= {ids.numel() - 1}")
    return ids[: n_windows * width].view(n_windows, width)


def split_windows(windows: torch.Tensor, val_fraction: float,
                  seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Split (M, W) windows into (train, val), val a contiguous block of round(M * val_fraction).

    seed=None: val is the last block (the end of the text). An int seed places
    the block at a position drawn from it. Train and val never share a window.
    """
    if not isinstance(windows, torch.Tensor) or windows.dim() != 2:
        raise ValueError("windows is not allowed: expected a (M, seq_len + 1) tensor")
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) \
            or not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction={val_fraction!r} is not allowed: expected a number "
                         "in (0, 1)")
    n_windows = windows.shape[0]
    n_val = max(1, round(n_windows * val_fraction))
    if n_val >= n_windows:
        raise ValueError(f"windows with {n_windows} row(s) are not allowed: holding out "
                         f"val_fraction={val_fraction} needs at least {n_val + 1} windows; use a "
                         "smaller seq_len or a larger corpus")
    if seed is None:
        start = n_windows - n_val
    else:
        check_int("seed", seed, 0)
        start = random.Random(seed).randrange(n_windows - n_val + 1)
    val = windows[start:start + n_val]
    train = torch.cat([windows[:start], windows[start + n_val:]])
    return train, val


class LMWindows(Dataset):
    """Map-style dataset over (M, T + 1) windows: item i -> (x (T,), y (T,)) int64, y = next tokens."""

    def __init__(self, windows: torch.Tensor):
        if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.shape[1] < 2:
            shape = tuple(windows.shape) if isinstance(windows, torch.Tensor) else None
            raise ValueError(f"windows of shape {shape} are not allowed: expected (M, T + 1) "
                             "with T >= 1")
        self.windows = windows

    @property
    def seq_len(self) -> int:
        return self.windows.shape[1] - 1

    def __len__(self) -> int:
        return self.windows.shape[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.windows[index].long()         # (T + 1,)
        return row[:-1], row[1:]


def corpus_windows(corpus: Corpus, seq_len: int, val_fraction: float,
                   tokenizer=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val) windows of ``corpus``: its own validation split when it has one,
    otherwise the last ``val_fraction`` of its windows."""
    train = pack_windows(_token_ids(corpus, tokenizer), seq_len)
    if "validation" in corpus.splits:
        return train, pack_windows(_token_ids(corpus.splits["validation"], tokenizer), seq_len)
    return split_windows(train, val_fraction)


def _one_thread_worker(worker_id: int) -> None:
    """DataLoader workers use one intra-op thread each, so they never crowd the trainer."""
    torch.set_num_threads(1)


def _worker_options(num_workers: int) -> dict:
    num_workers = usable_workers(num_workers)
    if num_workers == 0:
        return {"num_workers": 0}
    return {"num_workers": num_workers, "worker_init_fn": _one_thread_worker,
            "persistent_workers": True}


def make_loaders(run_cfg, corpus: Corpus | str | None = None, tokenizer=None, *,
                 allow_fallback: bool = False) -> tuple[DataLoader, DataLoader]:
    """(train_loader, val_loader) of (x, y) int64 batches, both (B, T), T = run_cfg.model.seq_len.

    corpus: a Corpus, a corpus name, or None for ``run_cfg.train.corpus``; tokenizer:
    None for ``get_tokenizer(run_cfg.train.tokenizer)`` (bytes unless set).
    The train loader shuffles with a generator seeded by ``run_cfg.train.seed``
    and drops the last partial batch; the validation loader keeps the order
    and runs in the main process. Workers (``num_workers``) get one thread each.
    """
    model_cfg, train_cfg = run_cfg.model, run_cfg.train
    tokenizer = tokenizer or get_tokenizer(train_cfg.tokenizer)
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise ValueError(f"vocab_size={model_cfg.vocab_size} is not allowed: the tokenizer has "
                         f"{tokenizer.vocab_size} ids; expected vocab_size >= "
                         f"{tokenizer.vocab_size}")
    if corpus is None or isinstance(corpus, str):
        corpus = load_corpus(corpus or train_cfg.corpus, allow_fallback=allow_fallback)
    train, val = corpus_windows(corpus, model_cfg.seq_len, train_cfg.val_fraction, tokenizer)
    if len(train) < train_cfg.batch_size:
        raise ValueError(f"batch_size={train_cfg.batch_size} is not allowed: corpus "
                         f"{corpus.name!r} gives only {len(train)} training windows of seq_len="
                         f"{model_cfg.seq_len}; expected batch_size <= {len(train)} (or use a "
                         "shorter seq_len or a larger corpus)")
    generator = torch.Generator().manual_seed(train_cfg.seed)
    train_loader = DataLoader(LMWindows(train), batch_size=train_cfg.batch_size, shuffle=True,
                              drop_last=True, generator=generator,
                              **_worker_options(train_cfg.num_workers))
    val_loader = DataLoader(LMWindows(val), batch_size=train_cfg.batch_size, shuffle=False)
    return train_loader, val_loader
