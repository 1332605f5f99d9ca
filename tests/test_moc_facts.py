"""tasks.facts: the entity -> attribute corpus and its recall probe (knowledge retention)."""

import pytest
import torch

from blockmem_lite.models.base import IGNORE_INDEX
from blockmem_lite.tasks import FACT_RELATIONS, FACT_VALUE_LEN, Facts, facts, task_accuracy
from blockmem_lite.tokenizer import ByteTokenizer

BYTES = ByteTokenizer()


def test_same_seed_same_facts_other_seed_other_facts():
    a, b, c = facts(20, seed=3), facts(20, seed=3), facts(20, seed=4)
    assert a == b and a.text(2) == b.text(2)
    assert torch.equal(a.recall_probe(64).inputs, b.recall_probe(64).inputs)
    assert a.values != c.values and a.entities != c.entities


def test_table_shape_names_and_values():
    table = facts(30, relations=("city", "pet"), seed=1)
    assert table.n_facts == 60 and table.relations == ("city", "pet")
    assert len(set(table.entities)) == 30
    assert all(len(e) == 6 and e[0].isupper() for e in table.entities)
    for e in range(30):
        assert table.values[e][0] in FACT_RELATIONS["city"]
        assert table.values[e][1] in FACT_RELATIONS["pet"]
    assert table.fact(3) == (table.entities[1], "pet", table.values[1][1])
    assert table.line(3) == f"{table.entities[1]}'s pet is {table.values[1][1]}."


def test_every_value_has_the_fixed_length():
    for values in FACT_RELATIONS.values():
        assert all(len(v) == FACT_VALUE_LEN and v.isascii() and v.isalpha() for v in values)


def test_text_repeats_every_fact_in_new_orders():
    table = facts(10, seed=0)
    text = table.text(repeats=3)
    lines = text.splitlines()
    assert sorted(lines) == sorted(table.lines() * 3)
    passes = [lines[i:i + 40] for i in range(0, 120, 40)]
    assert passes[0] != passes[1]
    assert table.text(3, seed=5) != text and table.text(3, seed=5) == table.text(3, seed=5)


def test_windows_are_next_token_pairs_of_the_text():
    table = facts(10, seed=0)
    data = table.windows(seq_len=32, repeats=4)
    ids = torch.tensor(list(table.text(4).encode("ascii")))
    assert len(data) == ids.numel() // 33
    x, y = data[1]
    assert torch.equal(x, ids[33:65]) and torch.equal(y, ids[34:66])


def test_recall_probe_targets_are_the_value_bytes_and_the_context_hides_them():
    table = facts(12, seed=2)
    probe = table.recall_probe(64, n=10, seed=1)
    assert probe.inputs.shape == (10, 64) and probe.meta["facts"].shape == (10, 2)
    assert probe.answers().shape == (10, FACT_VALUE_LEN)
    for row in range(10):
        entity, relation, value = table.fact(row)
        assert BYTES.decode(probe.answers()[row]) == value
        text = BYTES.decode(probe.inputs[row])
        question = f"{entity}'s {relation} is "
        assert text.endswith(question + value)                # the final "." is not input
        context = text[:-len(question) - FACT_VALUE_LEN]
        assert context.endswith("\n")
        assert question not in context                      # never answered by the context
        positions = probe.meta["answer_positions"][row]
        entity_start = 64 - len(table.line(row)) + 1
        assert probe.meta["distances"][row].tolist() == [p + 1 - entity_start
                                                          for p in positions.tolist()]
    assert (probe.targets[~probe.mask] == IGNORE_INDEX).all()


def test_probe_scores_a_model_that_knows_the_answers():
    probe = facts(5, seed=0).recall_probe(40)

    class Oracle(torch.nn.Module):
        def forward(self, tokens):
            logits = torch.zeros(*tokens.shape, 256)
            rows = {tuple(r.tolist()): i for i, r in enumerate(probe.inputs)}
            for b, row in enumerate(tokens):
                i = rows[tuple(row.tolist())]
                logits[b, probe.mask[i], probe.targets[i][probe.mask[i]]] = 1.0
            return logits

    assert task_accuracy(Oracle(), probe) == 1.0


@pytest.mark.parametrize("call, message", [
    (lambda: facts(1), r"n_entities=1 is not allowed"),
    (lambda: facts(5, relations=("height",)), r"relations=\('height',\) is not allowed"),
    (lambda: facts(5, relations=("city", "city")), r"relations=.* is not allowed: expected distinct"),
    (lambda: facts(20_000), r"n_entities=20000 is not allowed"),
    (lambda: facts(5).recall_probe(10), r"seq_len=10 is not allowed"),
    (lambda: facts(5).recall_probe(64, n=21), r"n=21 is not allowed: expected 1 <= n <= 20"),
    (lambda: facts(5).text(0), r"repeats=0 is not allowed"),
])
def test_bad_arguments_are_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_facts_object_is_a_frozen_value():
    table = facts(3)
    assert isinstance(table, Facts)
    with pytest.raises(AttributeError):
        table.seed = 1
