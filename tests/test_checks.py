"""check_* helpers: one OK line on success, precise messages on failure, causality with teeth."""

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from blockmem_lite import build_model, preset
from blockmem_lite.checks import (
    CheckFailed,
    check_causal,
    check_close,
    check_equal,
    check_shape,
    check_true,
    default_probes,
    default_tolerances,
)
from blockmem_lite.masks import causal_mask
from blockmem_lite.nn import reference_attention
from blockmem_lite.own_work import check_gradients, check_own_work


def _one_ok_line(capsys) -> str:
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("OK "), lines
    return lines[0]


def test_check_failed_is_an_assertion_error():
    assert issubclass(CheckFailed, AssertionError)


# --- check_shape ----------------------------------------------------------------------------


def test_check_shape_passes_with_wildcards(capsys):
    check_shape(torch.zeros(2, 5, 8), (2, None, -1), "q")
    assert _one_ok_line(capsys) == "OK q: shape (2, 5, 8)"


def test_check_shape_names_the_wrong_dim():
    with pytest.raises(CheckFailed) as err:
        check_shape(torch.zeros(2, 5, 4), (2, None, 8), "q")
    text = str(err.value)
    assert text.startswith("q: wrong shape")
    assert "expected (2, *, 8)" in text and "got      (2, 5, 4)" in text
    assert "dim 2: expected 8, got 4" in text


def test_check_shape_reports_wrong_rank_and_missing_values():
    with pytest.raises(CheckFailed, match="wrong number of dimensions"):
        check_shape(torch.zeros(2, 5), (2, 5, 1))
    with pytest.raises(CheckFailed, match="got None"):
        check_shape(None, (2,))
    with pytest.raises(CheckFailed, match="type list, which has no shape"):
        check_shape([1, 2], (2,))


def test_check_shape_rejects_bad_expected():
    with pytest.raises(ValueError, match="expected="):
        check_shape(torch.zeros(2), ("2",))


# --- check_close ----------------------------------------------------------------------------


def test_check_close_passes_and_prints_one_line(capsys):
    x = torch.randn(3, 4)
    check_close(x + 1e-7, x.double(), "out")
    line = _one_ok_line(capsys)
    assert line.startswith("OK out: close, max abs diff") and "shape (3, 4)" in line


def test_check_close_reports_max_diff_index_values_and_dtypes():
    expected = torch.zeros(2, 3, dtype=torch.float64)
    got = torch.zeros(2, 3)
    got[1, 2], got[0, 0] = 0.5, 1e-3
    with pytest.raises(CheckFailed) as err:
        check_close(got, expected, "attention")
    text = str(err.value)
    assert text.startswith("attention: 2 of 6 values differ")
    assert "max abs diff 0.5 at index (1, 2): got 0.5, expected 0" in text
    assert "got float32, expected float64" in text


def test_check_close_shape_mismatch_is_clear():
    with pytest.raises(CheckFailed, match=r"shapes differ(.|\n)*expected shape \(3,\)"):
        check_close(torch.zeros(1, 3), torch.zeros(3))


def test_check_close_nan_only_matches_nan(capsys):
    nan = float("nan")
    check_close(torch.tensor([1.0, nan]), torch.tensor([1.0, nan]))
    _one_ok_line(capsys)
    with pytest.raises(CheckFailed, match=r"max abs diff nan at index \(1,\)"):
        check_close(torch.tensor([1.0, nan]), torch.tensor([1.0, 2.0]))


def test_check_close_uses_rtol_and_accepts_numbers(capsys):
    check_close(torch.tensor(1000.05), 1000.0, "loss", atol=0.0, rtol=1e-4)
    _one_ok_line(capsys)
    with pytest.raises(CheckFailed):
        check_close(torch.tensor(1000.2), 1000.0, "loss", atol=0.0, rtol=1e-4)
    check_close([0.5, 0.25], torch.tensor([0.5, 0.25]))
    _one_ok_line(capsys)


def test_check_close_defaults_follow_the_dtype_as_torch_testing_does(capsys):
    one = torch.ones(4, dtype=torch.float64)
    check_close(one + 5e-8, one, "float64 at 5e-8")        # inside 1e-7 + 1e-7 * 1
    assert "atol=1e-07, rtol=1e-07" in _one_ok_line(capsys)
    with pytest.raises(CheckFailed, match="atol=1e-07 \\+ rtol=1e-07"):
        check_close(one + 1e-6, one, "float64 at 1e-6")      # the old rtol=1e-4 let this pass
    check_close((one + 1e-6).float(), one, "float32 vs float64")    # held to float32's
    assert "atol=1e-05, rtol=1.3e-06" in _one_ok_line(capsys)
    with pytest.raises(CheckFailed):
        check_close((one + 1e-4).float(), one, "float32 at 1e-4")
    check_close(0.1 + 0.2, 0.3, "Python floats are float64")
    assert "rtol=1e-07" in _one_ok_line(capsys)
    with pytest.raises(CheckFailed, match="atol=0 \\+ rtol=0"):
        check_close(torch.tensor([1, 2]), torch.tensor([1, 3]), "integers: exact")
    check_close(one + 1e-6, one, "atol given, rtol from the dtype", atol=1e-5)
    assert "atol=1e-05, rtol=1e-07" in _one_ok_line(capsys)
    assert default_tolerances(torch.float32, torch.float64) == (1.3e-6, 1e-5)


def test_check_close_none_says_what_to_do():
    with pytest.raises(CheckFailed, match="forget to return"):
        check_close(None, torch.zeros(2))


# --- check_equal / check_true ---------------------------------------------------------------


def test_check_equal_tensors_and_values(capsys):
    check_equal(torch.arange(4), torch.arange(4), "ids")
    assert _one_ok_line(capsys) == "OK ids: equal, shape (4,)"
    with pytest.raises(CheckFailed, match=r"1 of 4 elements differ\n  first at index \(2,\)"):
        check_equal(torch.tensor([0, 1, 5, 3]), torch.arange(4), "ids")
    check_equal("dense", "dense", "arch")
    _one_ok_line(capsys)
    with pytest.raises(CheckFailed, match="expected 'bcmt'"):
        check_equal("dense", "bcmt", "arch")


def test_check_true(capsys):
    check_true(torch.tensor(True), "loss went down")
    assert _one_ok_line(capsys) == "OK loss went down"
    with pytest.raises(CheckFailed, match="expected: loss went down\n  first 5.0, last 6.0"):
        check_true(False, "loss went down", detail="first 5.0, last 6.0")
    with pytest.raises(ValueError, match="one-element"):
        check_true(torch.tensor([True, False]), "ambiguous")


# --- check_causal ---------------------------------------------------------------------------


@pytest.fixture
def tokens():
    return torch.randint(0, 256, (2, 32))


def test_dense_model_is_causal_in_eval_mode_and_training_flag_restored(capsys, tokens):
    model = build_model(preset("tiny", dropout=0.5))  # dropout would move every output in train
    model.train()
    check_causal(model, tokens)
    line = _one_ok_line(capsys)
    assert line.startswith("OK causal:") and "probes [0, " in line and ", 16, 30]" in line
    assert model.training
    assert all(p.grad is None for p in model.parameters())


def _shifted_view(offset: int):
    """Output i = embedding of token i + embedding of token i + offset: sees the future."""
    table = torch.randn(256, 4)

    def fn(t):
        e = table[t]                                     # (B, T, 4)
        return e + torch.roll(e, -offset, dims=1)

    return fn


def test_leak_names_the_earliest_leaking_position_and_probe(tokens):
    with pytest.raises(CheckFailed) as err:
        check_causal(_shifted_view(3), tokens, positions=[10])
    text = str(err.value)
    assert "output at position 8 changed by" in text
    assert "after position 10" in text
    assert "3 of these 11 positions changed; the earliest is 8" in text


def test_no_teeth_when_the_output_ignores_the_input(capsys, tokens):
    constant = lambda t: torch.zeros(*t.shape, 5)
    with pytest.raises(CheckFailed, match="no teeth"):
        check_causal(constant, tokens)
    check_causal(constant, tokens, require_teeth=False)
    _one_ok_line(capsys)


def test_float_inputs_causal_attention_passes_and_full_attention_fails(capsys):
    x = torch.randn(2, 12, 8, dtype=torch.float64)

    def attend(x, mask=None):
        q = x[:, None]                                   # (B, 1, T, D)
        out, _ = reference_attention(q, q, q, mask=mask)
        return out[:, 0]                                 # (B, T, D)

    check_causal(lambda x: attend(x, causal_mask(12)), x)
    _one_ok_line(capsys)
    with pytest.raises(CheckFailed, match="output at position 0 changed"):
        check_causal(attend, x)


def test_block_boundaries_are_probed():
    assert default_probes(64, [16]) == [0, 15, 16, 31, 32, 62]
    assert default_probes(8) == [0, 2, 4, 6]


def test_block_size_is_read_from_the_model_config():
    """A leak only across the first block boundary (position 16) is found by the L-1 probe."""

    class BoundaryLeak:
        cfg = SimpleNamespace(vocab_size=256, arch="bcmt", block_size=16)

        def __call__(self, t):
            out = t.float()[..., None].clone()           # (B, T, 1)
            out[:, 15] += t[:, 16, None]                 # the last token of block 0 sees block 1
            return out

    t = torch.randint(0, 256, (1, 64))
    check_causal(BoundaryLeak(), t, positions=[0, 32, 62])  # misses the leak
    with pytest.raises(CheckFailed, match="output at position 15 changed"):
        check_causal(BoundaryLeak(), t)


def test_causal_rejects_bad_arguments(tokens):
    fn = _shifted_view(0)
    with pytest.raises(ValueError, match="positions="):
        check_causal(fn, tokens, positions=[31])
    with pytest.raises(ValueError, match="T >= 2"):
        check_causal(fn, tokens[:, :1])
    with pytest.raises(ValueError, match="time on dim 1"):
        check_causal(lambda t: torch.zeros(t.shape[1], 3), tokens)


def test_perturbation_changes_every_future_token(tokens):
    seen = []

    def record(t):
        seen.append(t.clone())
        return t.float()[..., None]

    check_causal(record, tokens, positions=[5], vocab_size=256)
    base, changed = seen
    assert torch.equal(base[:, :6], changed[:, :6])
    assert bool((base[:, 6:] != changed[:, 6:]).all())
    assert int(changed.max()) < 256 and not math.isnan(float(changed.float().mean()))


# --- every helper probed with wrong inputs: a clear message, never a raw error -----------------

_ARR = np.zeros((2, 3))


def _running_sum(t):
    """A causal function: output i is the running sum of the inputs up to i."""
    return torch.cumsum(t.float(), 1)[..., None]


_TOK = torch.randint(0, 10, (1, 8))
_ZEROS = torch.zeros(1, 8, 1)
_INF_AT_0 = torch.cat([torch.full((1, 1, 1), math.inf), torch.zeros(1, 7, 1)], dim=1)


def _nan_when_any_input_moves(t):
    """Not causal: every output goes NaN when any input (even a later one) is not 0."""
    return torch.where(t.abs().sum(1, keepdim=True) > 0, math.nan, 0.0).expand_as(t)


def _inf_where_input_moves(t):
    """Causal, but inf wherever the input is not 0: the change there cannot be measured."""
    return torch.where(t != 0, math.inf, t).cumsum(1)
_EXPECT_ARGS = "expected a finite number"

BAD_ARGUMENTS = {  # a teacher's or student's bad argument: ValueError `name=value is not allowed`
    "shape expected None": (lambda: check_shape(_ARR, None), "expected=None is not allowed"),
    "shape expected str": (lambda: check_shape(_ARR, "2"), "expected='2' is not allowed"),
    "shape name None": (lambda: check_shape(_ARR, (2, 3), None), "name=None is not allowed"),
    "close complex atol": (lambda: check_close(1.0, 1.0, atol=1j), "atol=1j is not allowed"),
    "close atol nan": (lambda: check_close(1.0, 2.0, atol=math.nan), "atol=nan is not allowed"),
    "close atol inf": (lambda: check_close(1.0, 2.0, atol=math.inf), "atol=inf is not allowed"),
    "close rtol str": (lambda: check_close(1.0, 2.0, rtol="0.1"), "rtol='0.1' is not allowed"),
    "close atol str": (lambda: check_close(1.0, 2.0, atol="1e-3"), "atol='1e-3' is not allowed"),
    "close atol -1": (lambda: check_close(1.0, 1.0, atol=-1), "atol=-1 is not allowed: " +
                      _EXPECT_ARGS + " >= 0"),
    "equal name int": (lambda: check_equal(1, 1, 3), "name=3 is not allowed"),
    "true numpy many": (lambda: check_true(np.array([True, False]), "x"), "one-element"),
    "true None": (lambda: check_true(None, "x"), "condition=None is not allowed: expected a bool"),
    "true str": (lambda: check_true("yes", "x"), "condition='yes' is not allowed"),
    "true float": (lambda: check_true(0.5, "x"), "condition=0.5 is not allowed"),
    "true nan": (lambda: check_true(math.nan, "x"), "condition=nan is not allowed"),
    "true list": (lambda: check_true([False], "x"), "condition=[False] is not allowed"),
    "true float tensor": (lambda: check_true(torch.tensor(0.5), "x"), "dtype float32 is not"),
    "true message None": (lambda: check_true(True, None), "message=None is not allowed"),
    "causal atol -1": (lambda: check_causal(_running_sum, _TOK, atol=-1), "atol=-1 is not allowed: " +
                       _EXPECT_ARGS + " > 0"),
    "causal atol 0": (lambda: check_causal(_running_sum, _TOK, atol=0), "atol=0 is not allowed"),
    "causal atol nan": (lambda: check_causal(_running_sum, _TOK, atol=math.nan), "atol=nan"),
    "causal atol str": (lambda: check_causal(_running_sum, _TOK, atol="x"), "atol='x' is not allowed"),
    "causal tokens None": (lambda: check_causal(_running_sum, None), "tokens=None is not allowed"),
    "causal tokens str": (lambda: check_causal(_running_sum, "abc"), "tokens='abc' is not allowed"),
    "causal tokens 1-d": (lambda: check_causal(_running_sum, torch.arange(5)), "of shape (5,), dtype"),
    "causal tokens complex": (lambda: check_causal(_running_sum, torch.ones(1, 5, dtype=torch.complex64)),
                              "dtype complex64 is not allowed"),
    "causal model None": (lambda: check_causal(None, _TOK), "model_or_fn=None is not allowed"),
    "causal model str": (lambda: check_causal("model", _TOK), "model_or_fn='model'"),
    "causal positions str": (lambda: check_causal(_running_sum, _TOK, positions="3"), "positions='3'"),
    "causal positions float": (lambda: check_causal(_running_sum, _TOK, positions=[1.5]), "[1.5] is not"),
    "causal vocab 1": (lambda: check_causal(_running_sum, _TOK, vocab_size=1), "vocab_size=1 is not"),
    "causal vocab str": (lambda: check_causal(_running_sum, _TOK, vocab_size="x"), "vocab_size='x'"),
    "causal blocks str": (lambda: check_causal(_running_sum, _TOK, block_sizes="4"), "block_sizes='4'"),
    "causal blocks <0": (lambda: check_causal(_running_sum, _TOK, block_sizes=[-3]), "block_sizes=[-3]"),
    "causal empty batch": (lambda: check_causal(_running_sum, _TOK[:0]), "tokens=Tensor of shape "
                           "(0, 8), dtype int64 is not allowed: expected at least one sequence"),
    "causal empty floats": (lambda: check_causal(_running_sum, torch.zeros(0, 8, 3)),
                            "tokens=Tensor of shape (0, 8, 3), dtype float32 is not allowed"),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS, ids=list(BAD_ARGUMENTS))
def test_bad_arguments_say_what_was_expected(case):
    probe, text = BAD_ARGUMENTS[case]
    with pytest.raises(ValueError) as err:
        probe()
    assert not isinstance(err.value, CheckFailed) and text in str(err.value)


WRONG_ANSWERS = {  # what a student hands in: CheckFailed, expected vs got
    "shape str": (lambda: check_shape("ab", (2,)), "got an object of type str"),
    "shape float": (lambda: check_shape(1.5, ()), "type float, which has no shape"),
    "shape numpy": (lambda: check_shape(_ARR, (2, 4)), "dim 1: expected 4, got 3"),
    "close complex": (lambda: check_close(1 + 5j, 1.0), "max abs diff 5 at index (): got 1+5j"),
    "close str": (lambda: check_close("1.0", 1.0), "got str '1.0', not a tensor, array or number"),
    "close expected None": (lambda: check_close(1.0, None), "the expected value is None"),
    "close ragged list": (lambda: check_close([[1], [1, 2]], [1]), "cannot be read as numbers"),
    "close numpy": (lambda: check_close(np.ones(3), torch.zeros(3)), "3 of 3 values differ"),
    "close nan": (lambda: check_close(math.nan, 1.0), "max abs diff nan"),
    "close wrong shape": (lambda: check_close(torch.zeros(2, 3), _ARR.T), "shapes differ"),
    "equal numpy": (lambda: check_equal(np.arange(3), np.zeros(3)), "2 of 3 elements differ"),
    "equal numpy shape": (lambda: check_equal(np.arange(3), torch.arange(4)), "shapes differ"),
    "equal None": (lambda: check_equal(None, 3), "got      None\n  did the cell forget"),
    "equal None tensor": (lambda: check_equal(None, torch.arange(3)), "got None, not a tensor"),
    "equal str tensor": (lambda: check_equal("abc", torch.arange(3)), "got str 'abc'"),
    "equal list of arrays": (lambda: check_equal([_ARR], [_ARR + 1]), "cannot compare got list"),
    "true false": (lambda: check_true(np.bool_(False), "x"), "expected: x"),
    "causal nan outputs": (lambda: check_causal(lambda t: torch.full((1, 8, 1), math.nan), _TOK),
                           "the outputs are NaN at position 0 before any input was changed"),
    "causal inf inputs": (lambda: check_causal(lambda t: t.cumsum(1), _INF_AT_0), "the outputs are "
                          "inf at position 0 before any input was changed (the tokens hold inf at "
                          "position 0)"),
    "causal nan after change, past": (lambda: check_causal(_nan_when_any_input_moves, _ZEROS),
                                      "output at position 0 went NaN when only the inputs after "
                                      "position 0 were changed"),
    "causal inf after change, later": (lambda: check_causal(_inf_where_input_moves, _ZEROS),
                                       "output at position 1 went inf when the inputs after "
                                       "position 0 were changed"),
}


@pytest.mark.parametrize("case", WRONG_ANSWERS, ids=list(WRONG_ANSWERS))
def test_wrong_answers_fail_with_expected_vs_got(case):
    probe, text = WRONG_ANSWERS[case]
    with pytest.raises(CheckFailed) as err:
        probe()
    assert text in str(err.value)


RIGHT_ANSWERS = {
    "shape numpy": lambda: check_shape(_ARR, (2, -1)),
    "shape numpy ints": lambda: check_shape(_ARR, (np.int64(2), 3)),
    "close numpy": lambda: check_close(np.ones(3)[::-1], torch.ones(3)),
    "close complex": lambda: check_close(torch.tensor([1 + 5j]), [1 + 5j]),
    "close ints": lambda: check_close(2, 2),
    "equal numpy": lambda: check_equal(np.arange(3), np.arange(3)),
    "equal numpy vs tensor": lambda: check_equal(np.arange(3), torch.arange(3)),
    "equal nan": lambda: check_equal(math.nan, math.nan),
    "equal nan tensors": lambda: check_equal(torch.tensor([1.0, math.nan]),
                                             torch.tensor([1.0, math.nan])),
    "true numpy bool": lambda: check_true(np.bool_(True), "x"),
    "true one-element array": lambda: check_true(np.array([True]), "x"),
    "causal numpy tokens": lambda: check_causal(_running_sum, _TOK.numpy()),
    "causal list tokens": lambda: check_causal(_running_sum, _TOK.tolist()),
    "causal int position": lambda: check_causal(_running_sum, _TOK, positions=3),
    "causal complex outputs": lambda: check_causal(lambda t: _running_sum(t) * (1 + 1j), _TOK),
}


@pytest.mark.parametrize("case", RIGHT_ANSWERS, ids=list(RIGHT_ANSWERS))
def test_right_answers_in_other_forms_pass(case, capsys):
    RIGHT_ANSWERS[case]()
    assert _one_ok_line(capsys).startswith("OK ")


def test_a_failed_check_renders_briefly_in_ipython():
    """In a notebook a CheckFailed shows its message and what to do next, not a traceback
    through checks.py; the cell still fails (so Run All, nbval and grading see it)."""
    from IPython.core.interactiveshell import InteractiveShell

    from blockmem_lite import checks

    shell = InteractiveShell.instance()
    shown = []
    shell._showtraceback = lambda etype, value, stb: shown.append((etype, str(value), stb))
    shell.set_custom_exc((checks.CheckFailed,), checks.show_check_failure)
    result = shell.run_cell("from blockmem_lite.checks import check_equal\n"
                            "check_equal(41, 42, 'the answer')")
    assert not result.success and isinstance(result.error_in_exec, checks.CheckFailed)
    (etype, value, stb), = shown
    assert etype is checks.CheckFailed and "the answer: not equal" in value
    assert len(stb) == 2 and stb[0].startswith("CheckFailed: the answer: not equal")
    assert "Run > Run Selected Cell and All Below" in stb[1]
    assert not any("checks.py" in line for line in stb)


# --- check_own_work ----------------------------------------------------------------------------

from blockmem_lite import lab as _lab  # noqa: E402
from blockmem_lite.mechanisms import bcmt as _bcmt_mechanism  # noqa: E402
from blockmem_lite.models import bcmt as _bcmt  # noqa: E402
from blockmem_lite.plugged_in import check_plugged_in, swap_modules  # noqa: E402


def _own_decay(n, alpha):
    i = torch.arange(n)
    return alpha ** (i[:, None] - i[None, :]).clamp(min=0) * (i[:, None] >= i[None, :])


def _calls_directly(n, alpha):
    return _bcmt.decay_weights(n, alpha)


def _uses_a_helper(n, alpha):
    return 1.0 * _calls_directly(n, alpha)


def _calls_in_a_lambda(n, alpha):
    inner = lambda: _bcmt.decay_weights(n, alpha)         # noqa: E731
    return inner()


def memory_pays(results):                                 # the kit's name, calling the kit
    return _lab.memory_pays(results)


def _through_an_object(cfg, t):
    from blockmem_lite import registry
    return registry.get("bcmt").state_bytes(cfg, t)


class _Subclassed(_bcmt.BCMTLayer):
    pass


class _CallsTheShift(torch.nn.Module):
    def forward(self, m):
        return _bcmt.shift_one_block(m)


@pytest.mark.parametrize("answer, library, used", [
    (_calls_directly, (_bcmt.decay_weights,), "decay_weights"),
    (_uses_a_helper, (_bcmt.decay_weights,), "decay_weights"),
    (_calls_in_a_lambda, (_bcmt.decay_weights,), "decay_weights"),
    (_bcmt.decay_weights, (_bcmt.decay_weights,), "decay_weights"),
    (__import__("functools").partial(_bcmt.decay_weights, alpha=0.8), (_bcmt.decay_weights,),
     "decay_weights"),
    (memory_pays, (_lab.memory_pays,), "memory_pays"),
    (_through_an_object, (_bcmt_mechanism.state_bytes,), "state_bytes"),
    (_Subclassed, (_bcmt.BCMTLayer,), "BCMTLayer"),
    (_CallsTheShift, (_bcmt.BCMTLayer, _bcmt.shift_one_block), "shift_one_block"),
], ids=["direct", "helper", "lambda", "itself", "partial", "same name", "object attribute",
         "subclass", "method"])
def test_check_own_work_rejects_the_kits_piece(answer, library, used):
    with pytest.raises(CheckFailed, match=f"uses the kit's own blockmem_lite.*{used}") as err:
        check_own_work(answer, *library)
    assert "write that piece yourself" in str(err.value)


def _deep_attribute(n, alpha):
    import blockmem_lite
    return blockmem_lite.models.bcmt.decay_weights(n, alpha)


class _OwnMethodOfTheSameName(torch.nn.Module):
    def decay_weights(self, n, alpha):                    # the learner's own, same name
        return _own_decay(n, alpha)

    def forward(self, n):
        return self.decay_weights(n, 0.8)


def test_check_own_work_follows_module_attributes_but_not_own_methods(capsys):
    with pytest.raises(CheckFailed, match="decay_weights"):
        check_own_work(_deep_attribute, _bcmt.decay_weights)
    check_own_work(_OwnMethodOfTheSameName, _bcmt.decay_weights)
    _one_ok_line(capsys)


def test_check_own_work_accepts_own_code_and_common_method_names(capsys):
    check_own_work(_own_decay, _bcmt.decay_weights, name="my_decay_weights")
    assert _one_ok_line(capsys).startswith("OK my_decay_weights: your own code")

    def calls_some_forward(module, x):
        return module.forward(x)                          # not refused by the name "forward"
    check_own_work(calls_some_forward, torch.nn.Linear.forward)
    _one_ok_line(capsys)
    with pytest.raises(ValueError, match="library=\\(\\) is not allowed"):
        check_own_work(_own_decay)
    with pytest.raises(ValueError, match="piece=3 is not allowed"):
        check_own_work(3, _bcmt.decay_weights)


# --- check_plugged_in ----------------------------------------------------------------------------


def _tiny_bcmt():
    from blockmem_lite.config import ModelConfig
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="bcmt", vocab_size=32, d_model=32, n_layer=2, n_head=2,
                                    seq_len=32, block_size=8))
    for layer in model.blocks:
        torch.nn.init.normal_(layer.memory_proj.weight, std=0.2)   # the memory path matters
    return model


def _batches(n=6):
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 32, (2, 33), generator=g) for _ in range(2)]
    return [(data[i % 2][:, :-1], data[i % 2][:, 1:]) for i in range(n)]


class _SameLayer(_bcmt.BCMTLayer):
    pass


class _LeakyLayer(_bcmt.BCMTLayer):
    def forward(self, x, *args, **kwargs):
        return super().forward(x, *args, **kwargs) + 0.05 * torch.roll(x, -1, dims=1)


class _NoMemoryLayer(_bcmt.BCMTLayer):
    def forward(self, x, positions, *args, **kwargs):
        h = x + self.local_attention(self.norm1(x), positions)
        return h + self.mlp(self.norm2(h))


def _plug(cls):
    return lambda model: swap_modules(model, _bcmt.BCMTLayer, lambda old: cls(model.cfg, True))


def test_check_plugged_in_passes_the_same_layer_and_returns_both_curves(capsys):
    kit, yours = check_plugged_in(_tiny_bcmt, _plug(_SameLayer), _batches(), "same layer")
    assert kit == yours and len(kit) == 6 and kit[-1] < kit[0]
    out = capsys.readouterr().out
    assert "logits on shared weights" in out and "causal" in out and "loss falls" in out


@pytest.mark.parametrize("layer, message", [
    (_LeakyLayer, "not causal: the output at position 0"),
    (_NoMemoryLayer, "logits on shared weights"),
])
def test_check_plugged_in_rejects_a_wrong_layer(layer, message):
    with pytest.raises(CheckFailed, match=message):
        check_plugged_in(_tiny_bcmt, _plug(layer), _batches(), "wrong layer")


def test_check_plugged_in_says_when_nothing_was_replaced_or_weights_differ():
    with pytest.raises(CheckFailed, match="plug_in replaced 0 pieces"):
        check_plugged_in(_tiny_bcmt, lambda model: 0, _batches(), "nothing")

    class Renamed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(32, 32)
    with pytest.raises(CheckFailed, match="its weights do not match the kit's layer"):
        swap_modules(_tiny_bcmt(), _bcmt.BCMTLayer, lambda old: Renamed())
    with pytest.raises(ValueError, match="batches=.* is not allowed"):
        check_plugged_in(_tiny_bcmt, _plug(_SameLayer), _batches(1), "one batch")


def _stub_function(n, alpha):
    raise NotImplementedError("Exercise: write the missing code here (see the instructions above)")


class _StubLayer(torch.nn.Module):
    def forward(self, m):
        # HINT: shift by one block
        raise NotImplementedError("Exercise: replace this line with your code (the HINT above "
                                  "says where to start)")


@pytest.mark.parametrize("stub", [_stub_function, _StubLayer], ids=["function", "class"])
def test_check_own_work_says_a_blank_stub_is_not_written_and_never_ok(stub, capsys):
    with pytest.raises(CheckFailed, match="not written yet"):
        check_own_work(stub, _bcmt.decay_weights)
    assert "OK" not in capsys.readouterr().out


def test_an_answer_that_raises_its_own_not_implemented_error_is_not_a_stub(capsys):
    def own(n, alpha):
        if n < 0:
            raise NotImplementedError("negative sizes")
        return _own_decay(n, alpha)
    check_own_work(own, _bcmt.decay_weights)
    assert "OK own: your own code" in capsys.readouterr().out


# --- check_prediction ------------------------------------------------------------------------

from blockmem_lite.own_work import check_prediction  # noqa: E402


@pytest.mark.parametrize("predicted, actual", [
    ([5, 6, 7], [5, 6, 7]), (0.25, 0.25), (0.5, 0.5 + 1e-12), (3, 3),
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-9]))])
def test_a_right_prediction_is_ok(predicted, actual, capsys):
    check_prediction(predicted, actual, "positions that change")
    assert capsys.readouterr().out.startswith("OK positions that change: your prediction matches")


@pytest.mark.parametrize("predicted, actual", [
    ([5, 6], [5, 6, 7311]), (0.5, 0.7311), (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 7311.0])),
    (torch.ones(2), torch.ones(3) * 7311), ("five", 7311), (None, 7311)])
def test_a_wrong_prediction_is_told_so_without_the_right_value(predicted, actual):
    with pytest.raises(CheckFailed) as err:
        check_prediction(predicted, actual, "the horizon", hint="which blocks weigh most?")
    assert "7311" not in str(err.value) and "which blocks weigh most?" in str(err.value)
    assert "does not match" in str(err.value) or "got None" in str(err.value)


def test_a_float_prediction_is_judged_within_the_tolerance_given(capsys):
    check_prediction(0.5, 0.5004, "the weight", atol=1e-3)
    with pytest.raises(CheckFailed, match="does not match"):
        check_prediction(0.5, 0.51, "the weight", atol=1e-3)


# --- edge cases of the argument checks (issue 23, part 5.13) -----------------------------------

@pytest.mark.parametrize("call, error, message", [
    (lambda: check_close(torch.ones(2, device="meta"), torch.ones(2)), CheckFailed,
     "a meta tensor, which holds no values"),
    (lambda: default_probes(0), ValueError, "seq_len=0 is not allowed"),
    (lambda: default_probes(True), ValueError, "seq_len=True is not allowed"),
    (lambda: default_probes(8, [0]), ValueError, "block_sizes=[0] is not allowed"),
    (lambda: check_own_work(lambda: 1, len, name=""), ValueError, "name='' is not allowed"),
    (lambda: check_gradients(lambda a: (a, a), lambda a: a, (torch.ones(2),)), CheckFailed,
     "returns 2 outputs"),
    (lambda: check_gradients(lambda a: a.detach(), lambda a: a, (torch.ones(2),)), CheckFailed,
     "gradient with respect to input 0"),
    (lambda: check_gradients(lambda a: a, lambda a: a, (torch.ones(2, dtype=torch.long),)),
     ValueError, "expected floating-point tensors"),
])
def test_edge_cases_of_the_helpers_arguments_get_a_clear_error(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()


def test_default_probes_take_no_block_sizes_as_none_or_a_set():
    assert default_probes(8, None) == default_probes(8) == [0, 2, 4, 6]
    assert default_probes(64, {16}) == [0, 15, 16, 31, 32, 62]


def test_check_gradients_passes_the_same_function_and_names_a_missing_stop_gradient(capsys):
    x, y = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)

    def kit(a, b):
        return a * b.sum().detach(), a.sum()

    check_gradients(lambda a, b: (a * b.sum().detach(), a.sum()), kit, (x, y), "mine",
                    names=("a", "b"))
    assert capsys.readouterr().out.count("OK mine: gradient with respect to") == 2
    with pytest.raises(CheckFailed, match="mine: gradient with respect to b"):
        check_gradients(lambda a, b: (a * b.sum(), a.sum()), kit, (x, y), "mine",
                        names=("a", "b"))
