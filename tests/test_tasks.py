"""Synthetic tasks: layout, answers derived from the inputs, the distance asked for,
determinism, scoring with an oracle and a chance-level model, and clear errors."""

import functools

import pytest
import torch

from blockmem_lite import build_model, preset
from blockmem_lite.corpora import load_corpus
from blockmem_lite.models.base import IGNORE_INDEX
from blockmem_lite.tasks import (
    TRAIN_SEED_OFFSET,
    FreshRows,
    TaskBatch,
    accuracy_vs_distance,
    content_vocab,
    copy_task,
    mqar,
    passkey,
    query_slots,
    special_ids,
    task_accuracy,
)

SPECIAL = special_ids(256)


def _check_layout(batch: TaskBatch, n: int, seq_len: int, answers_per_row: int,
                  answers_follow: bool = True):
    assert batch.inputs.shape == batch.targets.shape == batch.mask.shape == (n, seq_len)
    assert batch.inputs.dtype == batch.targets.dtype == torch.long
    assert batch.mask.dtype == torch.bool
    assert torch.equal(batch.mask.sum(1), torch.full((n,), answers_per_row))
    assert torch.all(batch.targets[~batch.mask] == IGNORE_INDEX)
    assert torch.all(batch.targets[batch.mask] >= 0)
    positions = batch.meta["answer_positions"]
    assert torch.equal(batch.mask.nonzero()[:, 1].view(n, -1), positions)
    assert batch.meta["distances"].shape == (n, answers_per_row)
    if not answers_follow:                         # MQAR keeps its answers out of the inputs
        return
    # the target at an answer position is the next input token (teacher forcing)
    inside = positions < seq_len - 1
    following = batch.inputs.gather(1, (positions + 1).clamp(max=seq_len - 1))
    assert torch.equal(following[inside], batch.answers()[inside])


def _measured_distance(inputs_row: torch.Tensor, answer_position: int, answer: int) -> int:
    """How far back the answer token sits after the same context token as the question's."""
    question_token = inputs_row[answer_position]
    earlier = [s for s in range(answer_position)
               if inputs_row[s] == question_token and inputs_row[s + 1] == answer]
    assert earlier, "the answer cannot be found in the context"
    return answer_position - earlier[0]


# --- MQAR ----------------------------------------------------------------------------------
def test_mqar_answers_come_from_the_pairs_in_the_context():
    batch = mqar(8, 64, 6, n_queries=4, seed=1)
    _check_layout(batch, 8, 64, 4, answers_follow=False)
    n_keys = content_vocab(256) // 2
    for row in range(8):
        x = batch.inputs[row]
        pairs = {x[2 * i].item(): x[2 * i + 1].item() for i in range(6)}
        assert len(pairs) == 6                                     # keys distinct
        assert all(k < n_keys <= v < SPECIAL["key"] for k, v in pairs.items())
        for pos in batch.meta["answer_positions"][row].tolist():
            assert pos >= 12                                       # queries after the pairs
            assert batch.targets[row, pos].item() == pairs[x[pos].item()]
    assert not torch.equal(batch.meta["distances"][0], batch.meta["distances"][1])


def test_mqar_more_queries_than_pairs_ask_every_pair_then_repeat():
    batch = mqar(8, 64, 4, n_queries=20, seed=4)
    _check_layout(batch, 8, 64, 20, answers_follow=False)
    for row in range(8):
        x = batch.inputs[row]
        pairs = {x[2 * i].item(): x[2 * i + 1].item() for i in range(4)}
        asked = [x[pos].item() for pos in batch.meta["answer_positions"][row].tolist()]
        assert set(asked) == set(pairs)                            # every pair asked
        assert len(asked) == 20                                    # and some again
        assert [batch.targets[row, p].item() for p in batch.meta["answer_positions"][row]] \
            == [pairs[k] for k in asked]


def test_mqar_queries_from_keeps_every_query_beyond_it():
    batch = mqar(16, 64, 4, n_queries=query_slots(64, 4, 32), queries_from=32, seed=9)
    assert batch.meta["answer_positions"].shape == (16, 16) and query_slots(64, 4, 32) == 16
    positions, distances = batch.meta["answer_positions"], batch.meta["distances"]
    assert positions.min() == 32 and distances.min() >= 32 - 6     # the pairs sit in 0..7
    fill = special_ids(256)["fill"]
    assert torch.all(batch.inputs[:, 8:32] == fill)                # nothing between
    for row in range(16):
        for pos, answer, distance in zip(positions[row].tolist(), batch.answers()[row].tolist(),
                                         distances[row].tolist(), strict=True):
            assert _measured_distance(batch.inputs[row], pos, answer) == distance
    with pytest.raises(ValueError, match=r"queries_from=6 .*expected 8 <= queries_from < 64"):
        mqar(2, 64, 4, queries_from=6)
    with pytest.raises(ValueError, match="queries_from=32 is not allowed with distance=40"):
        mqar(2, 64, 4, queries_from=32, distance=40)
    with pytest.raises(ValueError, match="17 queries from position 32 need seq_len >= 65"):
        mqar(2, 64, 4, n_queries=17, queries_from=32)


def _answer_sources(batch: TaskBatch, row: int) -> list[list[int]]:
    """For each answer of ``row``: every input position up to its answer position that
    holds the answer token."""
    x = batch.inputs[row]
    return [(x[:pos + 1] == answer).nonzero().flatten().tolist()
            for pos, answer in zip(batch.meta["answer_positions"][row].tolist(),
                                   batch.answers()[row].tolist(), strict=True)]


@pytest.mark.parametrize("make", [lambda: mqar(16, 64, 8, seed=5),
                                  lambda: mqar(16, 64, 8, distance=30, seed=6),
                                  lambda: mqar(16, 96, 20, vocab_size=64, seed=7),
                                  lambda: mqar(16, 64, 4, n_queries=28, vocab_size=68, seed=8),
                                  lambda: mqar(16, 64, 4, n_queries=16, queries_from=32, seed=9)])
def test_mqar_answers_never_leak_into_the_inputs(make):
    """Each answer sits in the inputs once, at its pair: never after a query, so no later
    query can be answered by elimination (the one value not asked yet)."""
    batch = make()
    for row in range(len(batch)):
        pairs_end = 2 * batch.meta["n_pairs"]
        for sources in _answer_sources(batch, row):         # values may repeat across pairs
            assert sources and max(sources) < pairs_end
        x = batch.inputs[row]
        after_queries = batch.meta["answer_positions"][row] + 1
        after_queries = after_queries[after_queries < batch.seq_len]
        assert torch.all(x[after_queries] == special_ids(batch.meta["vocab_size"])["fill"])


def test_mqar_fixed_distance_is_exact():
    for distance in (12, 30, 53):
        batch = mqar(4, 64, 6, distance=distance, seed=2)
        assert torch.all(batch.meta["distances"] == distance)
        for row in range(4):
            for pos, answer in zip(batch.meta["answer_positions"][row].tolist(),
                                   batch.answers()[row].tolist(), strict=True):
                assert _measured_distance(batch.inputs[row], pos, answer) == distance


def test_mqar_random_distances_are_recorded_truthfully():
    batch = mqar(4, 96, 5, seed=3)
    for row in range(4):
        for pos, answer, d in zip(batch.meta["answer_positions"][row].tolist(),
                                  batch.answers()[row].tolist(),
                                  batch.meta["distances"][row].tolist(), strict=True):
            assert _measured_distance(batch.inputs[row], pos, answer) == d


# --- passkey -------------------------------------------------------------------------------
@pytest.mark.parametrize("filler", ["random", "text"])
def test_passkey_key_sits_at_the_distance_asked(filler):
    for distance in (6, 40, 59):
        batch = passkey(5, 64, distance, key_len=5, filler=filler, seed=4)
        _check_layout(batch, 5, 64, 5)
        for row in range(5):
            x = batch.inputs[row]
            query = (x == SPECIAL["query"]).nonzero().flatten().tolist()
            key = (x == SPECIAL["key"]).nonzero().flatten().tolist()
            assert query == [59] and len(key) == 1
            assert query[0] - key[0] == distance                   # measured, not trusted
            needle = x[key[0] + 1:key[0] + 6]
            assert torch.equal(batch.answers()[row], needle)
        assert torch.all(batch.meta["distances"] == distance)


def test_passkey_text_filler_is_offline_prose_with_a_digit_key():
    batch = passkey(3, 200, 100, filler="text", seed=0)
    assert torch.all((batch.answers() >= ord("0")) & (batch.answers() <= ord("9")))
    prose = load_corpus("offline").text.encode("utf-8")
    for row in range(3):
        haystack = bytes(batch.inputs[row, :95].tolist())          # before KEY at 200 - 5 - 100
        assert haystack in prose


# --- copy ----------------------------------------------------------------------------------
def test_copy_task_copies_the_segment_after_the_separator():
    batch = copy_task(6, 40, 8, gap=5, seed=5)
    _check_layout(batch, 6, 40, 8)
    for row in range(6):
        x = batch.inputs[row]
        sep = (x == SPECIAL["sep"]).nonzero().flatten().tolist()
        assert sep == [32]
        start = 32 - 5 - 8                                         # SEP - gap - copy_len
        assert torch.equal(batch.answers()[row], x[start:start + 8])
        assert torch.all(x[:start] == SPECIAL["fill"])
        assert torch.all(x[start + 8:32] == SPECIAL["fill"])
        for pos, answer in zip(batch.meta["answer_positions"][row].tolist(),
                               batch.answers()[row].tolist(), strict=True):
            if pos > 32:                                           # after SEP the token repeats
                assert _measured_distance(x, pos, answer) == 8 + 1 + 5
    assert torch.all(batch.meta["distances"] == 14)


# --- determinism, slicing, datasets ----------------------------------------------------------
@pytest.mark.parametrize("make", [lambda s: mqar(4, 48, 4, seed=s),
                                  lambda s: passkey(4, 48, 20, seed=s),
                                  lambda s: copy_task(4, 48, 10, seed=s)])
def test_tasks_are_deterministic_in_the_seed(make):
    a, b, c = make(7), make(7), make(8)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)


def test_slicing_and_dataset():
    batch = mqar(10, 48, 4, seed=0)
    assert len(batch) == 10
    part = batch[2:5]
    assert len(part) == 3 and torch.equal(part.inputs, batch.inputs[2:5])
    assert torch.equal(part.meta["distances"], batch.meta["distances"][2:5])
    assert part.meta["n_pairs"] == 4
    assert len(batch[-1]) == 1 and torch.equal(batch[-1].inputs, batch.inputs[-1:])
    x, y = batch.dataset()[3]
    assert torch.equal(x, batch.inputs[3]) and torch.equal(y, batch.targets[3])
    assert len(batch.dataset()) == 10


# --- scoring ---------------------------------------------------------------------------------
class Oracle:
    """Cheats: looks each row up in the batch it was built from and returns one-hot answers."""

    def __init__(self, batch: TaskBatch, vocab_size: int = 256):
        rows = zip(batch.inputs, batch.targets, strict=True)
        self.answers = {tuple(x.tolist()): y for x, y in rows}
        self.vocab_size = vocab_size

    def __call__(self, inputs):
        targets = torch.stack([self.answers[tuple(x.tolist())] for x in inputs])
        return torch.nn.functional.one_hot(targets.clamp(min=0), self.vocab_size).float()


class Guesser(torch.nn.Module):
    """Uniformly random logits: accuracy near 1 / vocab_size."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(0)

    def forward(self, inputs):
        return torch.randn(*inputs.shape, self.vocab_size, generator=self.generator)


def test_oracle_scores_one_and_guessing_scores_chance():
    batch = mqar(96, 48, 6, vocab_size=16, seed=0)           # 576 answers, chance 1/16
    assert task_accuracy(Oracle(batch, 16), batch, batch_size=10) == 1.0
    guess = task_accuracy(Guesser(16), batch, batch_size=10)
    assert abs(guess - 1 / 16) < 0.04
    copy = copy_task(20, 32, 8, seed=1)
    assert task_accuracy(Oracle(copy), copy) == 1.0
    wrong = Oracle(copy)
    wrong.answers = {k: (v + 1) % 256 for k, v in wrong.answers.items()}
    assert task_accuracy(wrong, copy) == 0.0


def test_task_accuracy_on_a_real_model_restores_training_mode():
    model = build_model(preset("tiny"))
    model.train()
    batch = passkey(6, 32, 10, seed=0)
    accuracy = task_accuracy(model, batch, batch_size=4)
    assert 0.0 <= accuracy <= 1.0
    assert model.training
    rows = accuracy_vs_distance(model, lambda d: passkey(4, 32, d, seed=0), [6, 12, 20])
    assert [r["distance"] for r in rows] == [6, 12, 20]
    assert all(r["task"] == "passkey" and r["n_answers"] == 20 for r in rows)


# --- errors ----------------------------------------------------------------------------------
def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match=r"distance=5 .*expected 12 <= distance <= 53"):
        mqar(2, 64, 6, distance=5)
    with pytest.raises(ValueError, match=r"n_pairs=200 .*expected n_pairs <= 126"):
        mqar(2, 1024, 200)
    with pytest.raises(ValueError, match="n_queries=7 .*distance=20"):
        mqar(2, 64, 6, n_queries=7, distance=20)
    with pytest.raises(ValueError, match="n_queries=0"):
        mqar(2, 64, 6, n_queries=0)
    with pytest.raises(ValueError, match="seq_len=16 .*seq_len >= 23"):
        mqar(2, 16, 6)
    with pytest.raises(ValueError, match=r"distance=60 .*expected 6 <= distance <= 59"):
        passkey(2, 64, 60)
    with pytest.raises(ValueError, match=r"distance=3 .*expected 6 <= distance"):
        passkey(2, 64, 3)
    with pytest.raises(ValueError, match="filler='noise'"):
        passkey(2, 64, 10, filler="noise")
    with pytest.raises(ValueError, match="vocab_size=64 .*filler='text'"):
        passkey(2, 64, 10, filler="text", vocab_size=64)
    with pytest.raises(ValueError, match="copy_len=20 .*2 \\* copy_len \\+ gap <= seq_len"):
        copy_task(2, 32, 20)
    with pytest.raises(ValueError, match="vocab_size=3"):
        special_ids(3)
    with pytest.raises(ValueError, match="n=0"):
        copy_task(0, 32, 4)
    with pytest.raises(ValueError, match="batch_size=0"):
        task_accuracy(Guesser(256), copy_task(2, 32, 4), batch_size=0)


# --- fresh rows ------------------------------------------------------------------------------
def _fresh_mqar(n=4096, stream=0):
    return FreshRows(functools.partial(mqar, seq_len=32, n_pairs=4), n, stream=stream)


def test_fresh_rows_come_from_their_own_seeds():
    rows = _fresh_mqar()
    x, y = rows[7]
    again = mqar(1, 32, 4, seed=TRAIN_SEED_OFFSET + 7)
    assert torch.equal(x, again.inputs[0]) and torch.equal(y, again.targets[0])
    assert torch.equal(rows[7][0], x)                                  # the same i, the same row
    assert not torch.equal(rows[8][0], x)
    assert not torch.equal(_fresh_mqar(stream=1)[7][0], x)             # another stream, others


def test_fresh_rows_are_distinct_and_never_held_out_rows():
    rows = _fresh_mqar()
    seen = {tuple(rows[i][0].tolist()) for i in range(400)}
    assert len(seen) == 400                                        # no small set to memorise
    held_out = mqar(400, 32, 4, seed=20_000)                       # the kit's evaluation seeds
    assert not seen & {tuple(r.tolist()) for r in held_out.inputs}


def test_fresh_rows_train_like_a_task_batch():
    rows = _fresh_mqar()
    x, y = rows[0]
    assert x.shape == y.shape == (32,) and x.dtype == y.dtype == torch.long
    assert int((y != IGNORE_INDEX).sum()) == 4                     # the four answers only
    with pytest.raises(IndexError, match="index=4096"):
        rows[4096]
    with pytest.raises(ValueError, match="n=0"):
        FreshRows(rows.make, 0)
