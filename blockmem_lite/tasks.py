"""Synthetic probes of memory at a chosen distance: MQAR, passkey, copy.

Each task builds full token sequences ``seq`` (N, T + 1) and returns a
``TaskBatch``: inputs = seq[:, :-1], targets = seq[:, 1:] kept only at the
answer positions (IGNORE_INDEX = -100 elsewhere); MQAR alone sets its targets
apart, so its answers never appear in the inputs. It is plain next-token
prediction, so ``lm_loss`` trains a model on a task unchanged.

Distance, the same for every task: how many tokens after its source an answer
token is written, i.e. position of the answer token in the question part minus
position of the same token in the context. ``meta["distances"]`` (N, K) holds
it for each of the K answers of a row, in position order, next to
``meta["answer_positions"]`` (N, K).

Special tokens sit at the top of the vocabulary (``special_ids``): with the
byte vocabulary (256) they are bytes 0xFC-0xFF, which never occur in UTF-8
text, so task tokens and text never collide. Task content uses the ids below them.

``facts`` is different: a table of entity -> attribute facts to pretrain on and
a recall probe whose answers are never in the context (knowledge in weights).

``FreshRows`` trains on a task without a fixed set of rows to memorise: row i is
drawn from its own seed when it is asked for, in a seed range no evaluation uses.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import torch
from torch.utils.data import Dataset, TensorDataset

from blockmem_lite.tokenizer import IGNORE_INDEX
from blockmem_lite.validation import check_int

SPECIAL_TOKENS = ("key", "query", "sep", "fill")   # ids vocab_size - 4 ... vocab_size - 1
PASSKEY_FILLERS = ("random", "text", "quiet")
_DIGITS = (ord("0"), ord("9") + 1)


def special_ids(vocab_size: int = 256) -> dict[str, int]:
    """Reserved ids: key (needle start), query (question), sep (copy separator), fill (padding)."""
    check_int("vocab_size", vocab_size, len(SPECIAL_TOKENS) + 2)
    first = vocab_size - len(SPECIAL_TOKENS)
    return {name: first + i for i, name in enumerate(SPECIAL_TOKENS)}


def content_vocab(vocab_size: int = 256) -> int:
    """How many ids tasks may use for content: 0 ... content_vocab - 1."""
    return min(special_ids(vocab_size).values())


@dataclass
class TaskBatch:
    """A batch of task sequences; indexing or slicing gives a smaller TaskBatch."""

    inputs: torch.Tensor       # (N, T) int64
    targets: torch.Tensor      # (N, T) int64, IGNORE_INDEX except at answer positions
    mask: torch.Tensor         # (N, T) bool, True at answer positions
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def __getitem__(self, index) -> TaskBatch:
        if isinstance(index, int):
            index = slice(index, index + 1 if index != -1 else None)
        n = len(self)
        meta = {k: v[index] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == n else v
                for k, v in self.meta.items()}
        return TaskBatch(self.inputs[index], self.targets[index], self.mask[index], meta)

    @property
    def seq_len(self) -> int:
        return self.inputs.shape[1]

    @property
    def n_answers(self) -> int:
        return int(self.mask.sum())

    def answers(self) -> torch.Tensor:
        """(N, K) the answer tokens of each row, in position order."""
        return self.targets[self.mask].view(len(self), -1)

    def dataset(self) -> TensorDataset:
        """A Dataset of (x (T,), y (T,)) pairs, y = targets (loss only at answers)."""
        return TensorDataset(self.inputs, self.targets)

    def to(self, device) -> TaskBatch:
        meta = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.meta.items()}
        return TaskBatch(self.inputs.to(device), self.targets.to(device), self.mask.to(device),
                         meta)


def _task_batch(seq: torch.Tensor, answer_positions: torch.Tensor, distances: torch.Tensor,
                meta: dict, answers: torch.Tensor | None = None) -> TaskBatch:
    """seq (N, T + 1), answer_positions and distances (N, K) -> TaskBatch.

    ``answers`` (N, K): the targets at the answer positions when they are not the next
    token of ``seq`` (MQAR keeps its answers out of the inputs)."""
    inputs = seq[:, :-1].contiguous()                                   # (N, T)
    mask = torch.zeros_like(inputs, dtype=torch.bool)
    mask.scatter_(1, answer_positions, True)
    targets = torch.where(mask, seq[:, 1:], torch.full_like(inputs, IGNORE_INDEX))
    if answers is not None:
        targets.scatter_(1, answer_positions, answers)
    meta = {**meta, "answer_positions": answer_positions, "distances": distances}
    return TaskBatch(inputs, targets, mask, meta)


def _distinct(n: int, high: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """(n, k) ids drawn from [0, high) without repetition within a row, in random order."""
    return torch.rand(n, high, generator=generator).argsort(dim=1)[:, :k]


def _check_common(n: int, seq_len: int, seed: int) -> None:
    check_int("n", n, 1)
    check_int("seq_len", seq_len, 2)
    check_int("seed", seed, 0)


# --- multi-query associative recall --------------------------------------------------------
def mqar(n: int, seq_len: int, n_pairs: int, *, n_queries: int | None = None,
         distance: int | None = None, queries_from: int | None = None, vocab_size: int = 256,
         seed: int = 0) -> TaskBatch:
    """Multi-query associative recall: key-value pairs, then keys again; predict their values.

    One row (T = seq_len)::

        k1 v1 k2 v2 ... kP vP  fill ... k_a fill  fill ... k_b fill ...
                                        ^ answer position: predict v_a after k_a

    Keys come from the lower half of the content ids, values from the upper
    half; keys are distinct within a row. ``n_queries`` keys (default one per pair) are
    asked; with more queries than pairs every pair is asked once and the rest are asked
    again at random, which gives a row more answers to learn from at no extra length.
    An answer is never written into the inputs (the slot after a query holds fill): had
    it been, a later query could be answered by elimination ("the one value not asked
    yet"), which a model learns long before recall and which scores 0.52 with 4 pairs
    (the mean of 1/4, 1/3, 1/2, 1) and 0.34 with 8, without looking at a key.

    distance=None: queries sit at random slots after the pairs, in random order
    (distances vary; see meta["distances"]). distance=d: the query of pair i
    sits exactly d tokens after pair i's key, so queries follow the pairs'
    order. Use it to measure recall against distance, not to train: a model
    could learn "copy the token d back" instead of recall.

    queries_from=q: no query before position q (fill up to there), e.g. two blocks after
    the pairs, so that every answer lies beyond a block-local model's span.
    ``query_slots`` says how many queries fit.
    """
    _check_common(n, seq_len, seed)
    check_int("n_pairs", n_pairs, 1)
    n_keys = content_vocab(vocab_size) - mqar_value_count(vocab_size)
    if n_pairs > n_keys:
        raise ValueError(f"n_pairs={n_pairs} is not allowed with vocab_size={vocab_size}: keys "
                         f"must be distinct; expected n_pairs <= {n_keys}")
    n_queries = n_pairs if n_queries is None else n_queries
    check_int("n_queries", n_queries, 1)
    if distance is not None and n_queries > n_pairs:
        raise ValueError(f"n_queries={n_queries} is not allowed with distance={distance}: each "
                         f"pair is asked once, so expected 1 <= n_queries <= n_pairs={n_pairs}")
    if queries_from is not None and distance is not None:
        raise ValueError(f"queries_from={queries_from} is not allowed with distance={distance}: "
                         "a fixed distance places the queries itself; pass one of them")
    first = _first_query(seq_len, n_pairs, queries_from)
    n_slots = query_slots(seq_len, n_pairs, queries_from)
    if distance is None and n_queries > n_slots:
        raise ValueError(f"seq_len={seq_len} is not allowed: {n_pairs} pairs and {n_queries} "
                         f"queries from position {first} need seq_len >= "
                         f"{first + 2 * n_queries - 1}")
    if distance is not None:
        low, high = 2 * n_pairs, seq_len + 1 - 2 * n_pairs
        if isinstance(distance, bool) or not isinstance(distance, int) \
                or not low <= distance <= high:
            allowed = (f"expected {low} <= distance <= {high}" if low <= high
                       else f"no distance fits; expected seq_len >= {4 * n_pairs - 1}")
            raise ValueError(f"distance={distance!r} is not allowed with seq_len={seq_len} and "
                             f"n_pairs={n_pairs}: {allowed}")

    generator = torch.Generator().manual_seed(seed)
    fill = special_ids(vocab_size)["fill"]
    keys = _distinct(n, n_keys, n_pairs, generator)                                  # (N, P)
    values = torch.randint(n_keys, content_vocab(vocab_size), (n, n_pairs), generator=generator)
    seq = torch.full((n, seq_len + 1), fill, dtype=torch.long)
    seq[:, 0:2 * n_pairs:2] = keys
    seq[:, 1:2 * n_pairs:2] = values
    asked = _asked_pairs(n, n_pairs, n_queries, generator)                           # (N, Q)
    if distance is None:
        slots = _distinct(n, n_slots, n_queries, generator).sort(dim=1).values
        positions = first + 2 * slots                                                # (N, Q)
    else:
        asked = asked.sort(dim=1).values
        positions = 2 * asked + distance
    rows = torch.arange(n)[:, None]
    seq[rows, positions] = keys.gather(1, asked)       # the slot after a query stays fill
    meta = {"task": "mqar", "n_pairs": n_pairs, "n_queries": n_queries, "distance": distance,
            "queries_from": queries_from, "vocab_size": vocab_size, "seed": seed}
    return _task_batch(seq, positions, positions - 2 * asked, meta,
                       answers=values.gather(1, asked))


def mqar_value_count(vocab_size: int) -> int:
    """How many values MQAR draws from (with repeats): the upper half of the content ids."""
    return content_vocab(vocab_size) - content_vocab(vocab_size) // 2


def _first_query(seq_len: int, n_pairs: int, queries_from: int | None) -> int:
    """The first query position: right after the pairs, or ``queries_from`` (checked)."""
    if queries_from is None:
        return 2 * n_pairs
    if isinstance(queries_from, bool) or not isinstance(queries_from, int) \
            or not 2 * n_pairs <= queries_from < seq_len:
        raise ValueError(f"queries_from={queries_from!r} is not allowed with seq_len={seq_len} "
                         f"and n_pairs={n_pairs}: expected {2 * n_pairs} <= queries_from < "
                         f"{seq_len}")
    return queries_from


def query_slots(seq_len: int, n_pairs: int, queries_from: int | None = None) -> int:
    """How many 2-token query slots (key, fill) an MQAR row of ``seq_len`` holds after its
    pairs (from ``queries_from`` on): the most ``n_queries`` it can ask."""
    return (seq_len + 1 - _first_query(seq_len, n_pairs, queries_from)) // 2


def _asked_pairs(n: int, n_pairs: int, n_queries: int, generator: torch.Generator) -> torch.Tensor:
    """(n, n_queries) pair indices to ask: distinct while they last, then repeats at random."""
    first = _distinct(n, n_pairs, min(n_queries, n_pairs), generator)
    if n_queries <= n_pairs:
        return first
    again = torch.randint(0, n_pairs, (n, n_queries - n_pairs), generator=generator)
    asked = torch.cat([first, again], dim=1)
    return asked.gather(1, torch.rand(asked.shape, generator=generator).argsort(dim=1))


# --- passkey / needle in a haystack ---------------------------------------------------------
@lru_cache(maxsize=1)
def _filler_text_ids() -> torch.Tensor:
    """(N,) uint8 bytes of the offline corpus, the haystack for filler='text'."""
    from blockmem_lite.corpora import _token_ids, load_corpus

    return _token_ids(load_corpus("offline"))


def _text_filler(n: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """(n, length) int64 windows of offline-corpus bytes at random offsets."""
    text = _filler_text_ids()
    if length > text.numel():
        raise ValueError(f"seq_len={length - 1} is not allowed with filler='text': the offline "
                         f"corpus has {text.numel()} bytes; expected seq_len < {text.numel()}")
    starts = torch.randint(0, text.numel() - length + 1, (n, 1), generator=generator)
    return text[starts + torch.arange(length)].long()


def passkey(n: int, seq_len: int, distance: int, *, key_len: int = 5, filler: str = "random",
            vocab_size: int = 256, seed: int = 0) -> TaskBatch:
    """Passkey retrieval: find a key hidden ``distance`` tokens before the question.

    One row (T = seq_len; the question is the end of the sequence)::

        filler ... KEY k1 .. kL  filler ...  QUERY k1 .. kL
                                             ^ answer positions: QUERY and k1 .. k(L-1)

    distance = position(QUERY) - position(KEY), between key_len + 1 and
    seq_len - key_len. filler="random": uniform content ids, key of content
    ids. filler="text": bytes of the offline corpus (needs vocab_size >= 256),
    key of ASCII digits, so a text-trained byte model sees text it knows.
    filler="quiet": one repeated fill token (a quiet haystack), key of ASCII digits
    (chance 1/10): the easiest form to learn, so a short run measures reach, not skill.
    """
    _check_common(n, seq_len, seed)
    check_int("key_len", key_len, 1)
    if filler not in PASSKEY_FILLERS:
        raise ValueError(f"filler={filler!r} is not allowed: expected one of "
                         f"{', '.join(PASSKEY_FILLERS)}")
    if filler == "text" and vocab_size < 256:
        raise ValueError(f"vocab_size={vocab_size} is not allowed with filler='text': byte text "
                         "needs vocab_size >= 256")
    low, high = key_len + 1, seq_len - key_len
    if isinstance(distance, bool) or not isinstance(distance, int) or not low <= distance <= high:
        allowed = (f"expected {low} <= distance <= {high}" if low <= high
                   else f"no distance fits; expected seq_len >= {2 * key_len + 1}")
        raise ValueError(f"distance={distance!r} is not allowed with seq_len={seq_len} and "
                         f"key_len={key_len}: {allowed}")

    generator = torch.Generator().manual_seed(seed)
    ids = special_ids(vocab_size)
    if filler == "text":
        seq = _text_filler(n, seq_len + 1, generator)
        key = torch.randint(*_DIGITS, (n, key_len), generator=generator)
    elif filler == "quiet":
        seq = torch.full((n, seq_len + 1), ids["fill"], dtype=torch.long)
        key = torch.randint(*_DIGITS, (n, key_len), generator=generator)
    else:
        seq = torch.randint(0, content_vocab(vocab_size), (n, seq_len + 1), generator=generator)
        key = torch.randint(0, content_vocab(vocab_size), (n, key_len), generator=generator)
    query_pos = seq_len - key_len
    key_pos = query_pos - distance
    seq[:, key_pos] = ids["key"]
    seq[:, key_pos + 1:key_pos + 1 + key_len] = key
    seq[:, query_pos] = ids["query"]
    seq[:, query_pos + 1:] = key
    positions = torch.arange(query_pos, seq_len).expand(n, key_len)                 # (N, L)
    meta = {"task": "passkey", "key_len": key_len, "distance": distance, "filler": filler,
            "vocab_size": vocab_size, "seed": seed}
    return _task_batch(seq, positions, torch.full((n, key_len), distance), meta)


# --- copy -----------------------------------------------------------------------------------
def copy_task(n: int, seq_len: int, copy_len: int, *, gap: int = 0, vocab_size: int = 256,
              seed: int = 0) -> TaskBatch:
    """Copy a random segment after a separator.

    One row (T = seq_len; the copy is the end of the sequence)::

        fill ... s1 .. sL  fill * gap  SEP s1 .. sL
                                       ^ answer positions: SEP and s1 .. s(L-1)

    Every answer's distance is copy_len + 1 + gap.
    """
    _check_common(n, seq_len, seed)
    check_int("copy_len", copy_len, 1)
    check_int("gap", gap, 0)
    if 2 * copy_len + gap > seq_len:
        raise ValueError(f"copy_len={copy_len} is not allowed with seq_len={seq_len} and "
                         f"gap={gap}: expected 2 * copy_len + gap <= seq_len")

    generator = torch.Generator().manual_seed(seed)
    ids = special_ids(vocab_size)
    segment = torch.randint(0, content_vocab(vocab_size), (n, copy_len), generator=generator)
    seq = torch.full((n, seq_len + 1), ids["fill"], dtype=torch.long)
    sep_pos = seq_len - copy_len
    start = sep_pos - gap - copy_len
    seq[:, start:start + copy_len] = segment
    seq[:, sep_pos] = ids["sep"]
    seq[:, sep_pos + 1:] = segment
    positions = torch.arange(sep_pos, seq_len).expand(n, copy_len)                  # (N, L)
    distance = copy_len + 1 + gap
    meta = {"task": "copy", "copy_len": copy_len, "gap": gap, "distance": distance,
            "vocab_size": vocab_size, "seed": seed}
    return _task_batch(seq, positions, torch.full((n, copy_len), distance), meta)


# --- fresh rows for training ---------------------------------------------------------------
# A CPU torch.Generator keeps only the low 32 bits of its seed (2**32 + 5 draws what 5
# draws), so every seed here lies in [0, 2**32): training rows take the upper half, from
# 2**31 on, in 2**24-row streams; the kit's evaluation seeds stay below 2**31, so no
# held-out row is ever a training row.
TRAIN_SEED_OFFSET = 1 << 31
_ROWS_PER_STREAM = 1 << 24
_STREAMS = (1 << 31) // _ROWS_PER_STREAM                              # 128


class FreshRows(Dataset):
    """``n`` task rows, each made from its own seed when it is asked for.

    ``make(count, seed=...)`` is any task builder returning a TaskBatch, e.g.
    ``functools.partial(mqar, seq_len=64, n_pairs=4)``. Row i is
    ``make(1, seed=TRAIN_SEED_OFFSET + stream * 2**24 + i)``: the same i always gives
    the same row (a Trainer's checkpoint resumes it), nothing is stored, and with ``n``
    of steps x batch every training step sees rows no step saw before. Items are
    (x (T,), y (T,)) like ``TaskBatch.dataset()``.
    """

    def __init__(self, make: Callable[..., TaskBatch], n: int, stream: int = 0):
        check_int("n", n, 1)
        check_int("stream", stream, 0)
        if stream >= _STREAMS:
            raise ValueError(f"stream={stream} is not allowed: expected 0 <= stream < {_STREAMS}")
        if n > _ROWS_PER_STREAM:
            raise ValueError(f"n={n} is not allowed: expected 1 <= n <= {_ROWS_PER_STREAM}")
        self.make, self.n, self.stream = make, n, stream

    def __len__(self) -> int:
        return self.n

    def seed_of(self, index: int) -> int:
        return TRAIN_SEED_OFFSET + self.stream * _ROWS_PER_STREAM + index

    def row(self, index: int) -> TaskBatch:
        """Row ``index`` as a one-row TaskBatch (its meta included)."""
        if not 0 <= index < self.n:
            raise IndexError(f"index={index} is not allowed: expected 0 <= index < {self.n}")
        return self.make(1, seed=self.seed_of(index))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.row(int(index))
        return batch.inputs[0], batch.targets[0]                                  # (T,), (T,)


# --- scoring --------------------------------------------------------------------------------
def model_device(model) -> torch.device:
    """The device of a model's first parameter (CPU for a model without parameters)."""
    parameters = getattr(model, "parameters", None)
    first = next(iter(parameters()), None) if callable(parameters) else None
    return first.device if first is not None else torch.device("cpu")


@torch.no_grad()
def task_accuracy(model, batch: TaskBatch, batch_size: int = 64) -> float:
    """Fraction of answer tokens where argmax(logits) is right (eval mode, no grad).

    ``model(inputs)`` may return a ModelOutput (``.logits``) or a logits tensor (B, T, V).
    """
    check_int("batch_size", batch_size, 1)
    if not isinstance(batch, TaskBatch) or batch.n_answers == 0:
        raise ValueError("batch is not allowed: expected a TaskBatch with answer positions")
    was_training = bool(getattr(model, "training", False))
    if hasattr(model, "eval"):
        model.eval()
    device = model_device(model)
    correct = 0
    try:
        for start in range(0, len(batch), batch_size):
            part = batch[start:start + batch_size]
            output = model(part.inputs.to(device))
            logits = getattr(output, "logits", output)                         # (b, T, V)
            predicted = logits.argmax(dim=-1).to(part.mask.device)            # (b, T)
            correct += int((predicted[part.mask] == part.targets[part.mask]).sum())
    finally:
        if was_training:
            model.train()
    return correct / batch.n_answers


def accuracy_vs_distance(model, make_batch: Callable[[int], TaskBatch], distances,
                         batch_size: int = 64) -> list[dict]:
    """[{distance, accuracy, n_answers, task}] for ``make_batch(d)`` at each distance d."""
    rows = []
    for distance in distances:
        batch = make_batch(distance)
        rows.append({"distance": distance, "accuracy": task_accuracy(model, batch, batch_size),
                     "n_answers": batch.n_answers, "task": batch.meta.get("task")})
    return rows


# --- facts: entity -> attribute knowledge, for knowledge retention and forgetting ------------
FACT_RELATIONS = {                  # relation -> its possible values (all FACT_VALUE_LEN bytes)
    "colour": ("amber", "azure", "coral", "ivory", "khaki", "lilac", "mauve", "ochre", "olive",
               "peach", "sepia", "taupe"),
    "city": ("Accra", "Cairo", "Delhi", "Hanoi", "Kyoto", "Lagos", "Milan", "Osaka", "Paris",
             "Perth", "Quito", "Seoul", "Sofia", "Tunis"),
    "pet": ("camel", "eagle", "gecko", "horse", "koala", "llama", "moose", "otter", "panda",
            "raven", "sheep", "sloth", "tiger", "zebra"),
    "food": ("apple", "bagel", "bread", "curry", "dates", "grape", "honey", "lemon", "mango",
             "melon", "pasta", "pizza", "salad", "sushi", "toast"),
}
FACT_VALUE_LEN = 5
_NAME_CONSONANTS = "bdfgklmnprstvz"
_NAME_VOWELS = "aeiou"
_MAX_ENTITIES = 10_000


@dataclass(frozen=True)
class Facts:
    """A fixed table of facts, one line each: ``"<Entity>'s <relation> is <value>."``.

    Entities are invented 6-letter names, values come from ``FACT_RELATIONS``
    (5 letters each). Text is ASCII, so byte ids are the tokens. Pretrain on
    ``text`` / ``windows`` (the facts in shuffled order), then ask
    ``recall_probe``: the value must come from the weights, never the context.
    """

    entities: tuple[str, ...]
    relations: tuple[str, ...]
    values: tuple[tuple[str, ...], ...]      # values[entity][relation]
    seed: int

    @property
    def n_facts(self) -> int:
        return len(self.entities) * len(self.relations)

    def fact(self, index: int) -> tuple[str, str, str]:
        """(entity, relation, value) of fact ``index`` (entity-major order)."""
        e, r = divmod(index, len(self.relations))
        return self.entities[e], self.relations[r], self.values[e][r]

    def line(self, index: int) -> str:
        entity, relation, value = self.fact(index)
        return f"{entity}'s {relation} is {value}."

    def lines(self) -> list[str]:
        return [self.line(i) for i in range(self.n_facts)]

    def text(self, repeats: int = 1, seed: int | None = None) -> str:
        """Every fact ``repeats`` times, each pass in a new shuffled order, one per line."""
        check_int("repeats", repeats, 1)
        rng = random.Random(self.seed if seed is None else seed)
        passes = []
        for _ in range(repeats):
            lines = self.lines()
            rng.shuffle(lines)
            passes.append("\n".join(lines) + "\n")
        return "".join(passes)

    def windows(self, seq_len: int, repeats: int, seed: int | None = None):
        """``text(repeats, seed)`` as next-token windows: a Dataset of (x (T,), y (T,))."""
        from blockmem_lite.corpora import LMWindows, encode, pack_windows

        return LMWindows(pack_windows(encode(self.text(repeats, seed)), seq_len))

    def recall_probe(self, seq_len: int, *, n: int | None = None, seed: int = 0) -> TaskBatch:
        """Ask the first ``n`` facts (default all): one row each, targets = the value bytes.

        One row (T = seq_len)::

            ...other facts...\\n Bodaki's colour is amber.
                                                ^^^^^ answers: the 5 value bytes

        The context before the question is other facts (never the asked one),
        so only knowledge stored in the model can answer. ``meta["distances"]``:
        from the entity's first byte to each answer byte; ``meta["facts"]``
        (N, 2): (entity index, relation index) of each row.
        """
        n = self.n_facts if n is None else n
        check_int("n", n, 1)
        if n > self.n_facts:
            raise ValueError(f"n={n} is not allowed: expected 1 <= n <= {self.n_facts} "
                             "(the number of facts)")
        check_int("seed", seed, 0)
        longest = max(len(line) for line in self.lines())
        check_int("seq_len", seq_len, longest)
        rng = random.Random(seed)
        rows, positions, distances = [], [], []
        for index in range(n):
            line = self.line(index)
            start = seq_len + 1 - len(line)
            rows.append(self._context(index, start, rng) + line)
            entity, relation, _ = self.fact(index)
            first_value = start + len(f"{entity}'s {relation} is ")
            answers = [first_value + j - 1 for j in range(FACT_VALUE_LEN)]      # input positions
            positions.append(answers)
            distances.append([a + 1 - start for a in answers])
        seq = torch.tensor([list(row.encode("ascii")) for row in rows], dtype=torch.long)
        facts = torch.tensor([divmod(i, len(self.relations)) for i in range(n)])
        meta = {"task": "facts_recall", "facts": facts, "relations": self.relations,
                "seed": seed, "facts_seed": self.seed, "vocab_size": 256}
        return _task_batch(seq, torch.tensor(positions), torch.tensor(distances), meta)

    def _context(self, asked: int, length: int, rng: random.Random) -> str:
        """``length`` characters of other facts' lines, ending with a newline."""
        if length == 0:
            return ""
        chosen, size = [], 0
        while size < length:
            other = rng.randrange(self.n_facts - 1)
            line = self.line(other + (other >= asked))        # any fact but the asked one
            chosen.append(line + "\n")
            size += len(line) + 1
        return "".join(reversed(chosen))[-length:]


def _invented_names(n: int, rng: random.Random) -> tuple[str, ...]:
    """``n`` distinct capitalised consonant-vowel names of 3 syllables (6 letters)."""
    names: dict[str, None] = {}
    while len(names) < n:
        name = "".join(rng.choice(_NAME_CONSONANTS) + rng.choice(_NAME_VOWELS) for _ in range(3))
        names[name.capitalize()] = None
    return tuple(names)


def facts(n_entities: int, *, relations=tuple(FACT_RELATIONS), seed: int = 0) -> Facts:
    """A deterministic table of ``n_entities`` x ``len(relations)`` facts (see ``Facts``).

    Each (entity, relation) gets a value drawn uniformly from that relation's
    values in ``FACT_RELATIONS``; the same seed always gives the same table.
    """
    check_int("n_entities", n_entities, 2)
    if n_entities > _MAX_ENTITIES:
        raise ValueError(f"n_entities={n_entities} is not allowed: expected 2 <= n_entities <= "
                         f"{_MAX_ENTITIES}")
    relations = (relations,) if isinstance(relations, str) else tuple(relations)
    unknown = [r for r in relations if r not in FACT_RELATIONS]
    if unknown or not relations or len(set(relations)) != len(relations):
        raise ValueError(f"relations={relations!r} is not allowed: expected distinct names from "
                         f"{', '.join(FACT_RELATIONS)}")
    check_int("seed", seed, 0)
    rng = random.Random(seed)
    entities = _invented_names(n_entities, rng)
    values = tuple(tuple(rng.choice(FACT_RELATIONS[r]) for r in relations) for _ in entities)
    return Facts(entities, relations, values, seed)
