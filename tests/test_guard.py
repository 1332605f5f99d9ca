"""The guard of check_own_work: while a check runs, the kit's piece is switched off inside the
learner's code, whatever route reaches it, and the check's own calls of it still work."""

import importlib
import inspect
import sys
import threading
import types

import pytest
import torch
import torch.nn.functional as F

from blockmem_lite import checks, guard, masks, scratch
from blockmem_lite.checks import CheckFailed, check_close, check_equal
from blockmem_lite.own_work import check_own_work


def honest_mask(q_len, kv_len):
    q_pos = torch.arange(kv_len - q_len, kv_len)[:, None]
    return torch.arange(kv_len)[None] <= q_pos


KEPT = {"mask": masks.causal_mask}
KEPT_LIST = [masks.causal_mask]
COPY = types.FunctionType(masks.causal_mask.__code__, masks.causal_mask.__globals__, "copy",
                          masks.causal_mask.__defaults__)
_namespace = {}
exec(inspect.getsource(masks.causal_mask).replace("def causal_mask", "def recompiled"),
     dict(vars(masks)), _namespace)
RECOMPILED = _namespace["recompiled"]


class Holder:
    mask = staticmethod(masks.causal_mask)


def looked_up_at_call_time(fn):
    def wrapper(q_len, kv_len):
        return getattr(masks, "causal_" + "mask")(q_len, kv_len)
    return wrapper


def swallows_the_refusal(q_len, kv_len):
    try:
        return KEPT["mask"](q_len, kv_len)
    except CheckFailed:
        return KEPT["mask"](q_len, kv_len)


def switches_the_profiler_off(q_len, kv_len, off=sys.setprofile):
    off(None)
    return KEPT["mask"](q_len, kv_len)


ROUTES = {   # each passes the bytecode check (check_own_work prints its OK first)
    "getattr with a built name": lambda q, k: getattr(masks, "causal_" + "mask")(q, k),
    "importlib": lambda q, k: getattr(importlib.import_module("blockmem_lite.masks"),  # noqa: B009
                                      "causal_mask")(q, k),
    "eval": lambda q, k: eval("masks.causal_mask")(q, k),
    "kept in a dict": lambda q, k: KEPT["mask"](q, k),
    "kept in a list": lambda q, k: KEPT_LIST[0](q, k),
    "a default argument": lambda q, k, f=masks.causal_mask: f(q, k),
    "a class attribute": lambda q, k: Holder.mask(q, k),
    "FunctionType from its __code__": lambda q, k: COPY(q, k),
    "recompiled from getsource, as a helper": lambda q, k: RECOMPILED(q, k),
    "a decorator looking it up at call time": looked_up_at_call_time(honest_mask),
    "the refusal caught and the call repeated": swallows_the_refusal,
    "the profiler switched off": switches_the_profiler_off,
    "the profiler of new threads switched off":
        lambda q, k: (threading.setprofile(None), KEPT["mask"](q, k))[1],
}


def _judge(answer):
    with check_own_work(answer, masks.causal_mask, name="my_mask"):
        check_equal(answer(3, 5), masks.causal_mask(3, 5), "mask")


SEEN_IN_THE_BYTECODE = {"eval": "uses eval",       # the bytecode check refuses these at once
                        "the profiler of new threads switched off": "uses setprofile"}


@pytest.mark.parametrize("route", list(ROUTES))
def test_every_route_to_the_switched_off_piece_is_refused(route, capsys):
    with pytest.raises(CheckFailed) as failed:
        _judge(ROUTES[route])
    out = capsys.readouterr().out
    if route in SEEN_IN_THE_BYTECODE:
        assert SEEN_IN_THE_BYTECODE[route] in str(failed.value) and "OK" not in out
        return
    assert "OK my_mask: your own code" in out, "the bytecode check alone would have passed"
    assert "OK mask" not in out, "a check passed after the refusal"
    assert ("switched off in this check" in str(failed.value)
            or "profiler off" in str(failed.value)), str(failed.value)
    assert sys.getprofile() is None and checks.ACTIVE_GUARDS == []


def test_the_same_routes_reach_the_kit_when_no_check_runs():
    for route, answer in ROUTES.items():
        if "profiler" not in route:
            assert torch.equal(answer(3, 5), masks.causal_mask(3, 5)), route


def test_an_answer_compiled_from_the_kit_source_is_refused_by_the_bytecode_check(capsys):
    with pytest.raises(CheckFailed, match="compiled again from its source"):
        check_own_work(RECOMPILED, masks.causal_mask)
    assert "OK" not in capsys.readouterr().out


def test_an_honest_answer_passes_and_the_check_may_call_the_piece(capsys):
    _judge(honest_mask)
    assert capsys.readouterr().out.count("OK ") == 2
    assert sys.getprofile() is None and checks.ACTIVE_GUARDS == []


def test_a_built_in_and_a_kit_function_are_switched_off_together():
    def by_hand(q, k, v):
        return (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1) @ v

    def with_sdpa(q, k, v, f=F.scaled_dot_product_attention):
        return f(q, k, v)

    q = torch.randn(1, 2, 4, 8)
    for answer, refused in ((by_hand, False), (with_sdpa, True)):
        try:
            with check_own_work(answer, scratch.attention, F.scaled_dot_product_attention):
                check_close(answer(q, q, q), F.scaled_dot_product_attention(q, q, q), "attn")
        except CheckFailed as e:
            assert refused and "scaled_dot_product_attention" in str(e), str(e)
        else:
            assert not refused, "SDPA reached through a default argument passed"


def test_a_class_is_switched_off_by_its_methods():
    from blockmem_lite.nn import KVCache

    made = {"cls": KVCache}

    def uses_the_cache(n):
        return made["cls"](1, 1, n, 4) is not None

    with pytest.raises(CheckFailed, match="KVCache"):
        with check_own_work(uses_the_cache, KVCache):
            check_equal(uses_the_cache(4), True, "cache")


def test_the_guard_puts_back_the_profiler_it_found():
    def other(frame, event, arg):
        return None

    sys.setprofile(other)
    try:
        with check_own_work(honest_mask, masks.causal_mask):
            assert sys.getprofile() is guard._watch_all
        assert sys.getprofile() is other
    finally:
        sys.setprofile(None)


def test_in_a_notebook_the_guard_ends_with_its_cell():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_cell("from blockmem_lite import masks\n"
                       "from blockmem_lite.own_work import check_own_work\n"
                       "kept = {'f': masks.causal_mask}\n"
                       "def mine(q, k):\n    return kept['f'](q, k)")
        result = shell.run_cell("check_own_work(mine, masks.causal_mask)\nmine(3, 5)")
        assert isinstance(result.error_in_exec, CheckFailed), result.error_in_exec
        assert checks.ACTIVE_GUARDS == [] and sys.getprofile() is None
        after = shell.run_cell("mine(3, 5).shape")        # a later, ordinary cell: kit reachable
        assert after.success and tuple(after.result) == (3, 5)
    finally:
        InteractiveShell.clear_instance()


def test_a_failure_says_when_the_answer_changed_its_input_in_place():
    from blockmem_lite.models.bcmt import shift_one_block

    def shifts_in_place(memories):
        memories[:, 1:] = memories[:, :-1].clone()
        memories[:, 0] = 0
        return memories

    def shifts(memories):
        return torch.cat([torch.zeros_like(memories[:, :1]), memories[:, :-1]], dim=1)

    m = torch.randn(2, 5, 3)
    with pytest.raises(CheckFailed, match=r"changed its input `memories` in place"):
        with check_own_work(shifts_in_place, shift_one_block):
            check_equal(shifts_in_place(m), shift_one_block(m), "shift")
    with check_own_work(shifts, shift_one_block):                 # no note for an honest one
        check_equal(shifts(m), shift_one_block(m), "shift")


def test_outside_a_notebook_the_guard_ends_with_the_function_that_installed_it(capsys):
    answer = ROUTES["kept in a dict"]

    def a_check_that_catches_the_refusal():
        check_own_work(answer, masks.causal_mask)
        with pytest.raises(CheckFailed):
            answer(3, 5)
        with pytest.raises(CheckFailed, match="switched off"):
            check_equal(1, 1, "a check after the refusal, in the same function")

    a_check_that_catches_the_refusal()
    check_equal(1, 1, "a later, unrelated check")            # the refusal does not leak here
    assert torch.equal(answer(3, 5), masks.causal_mask(3, 5))
    assert checks.ACTIVE_GUARDS == [] and sys.getprofile() is None


@pytest.mark.parametrize("answer, name", [
    (lambda q, k: sys._getframe(1).f_locals["expected"], "_getframe"),
    (lambda q, k: globals()["KEPT"]["mask"](q, k), "globals"),
    (lambda q, k: exec("pass"), "exec"),
    (lambda q, k: masks.causal_mask.__code__, "__code__"),
])
def test_an_answer_that_looks_into_the_check_is_refused_by_its_bytecode(answer, name):
    with pytest.raises(CheckFailed, match=f"uses {name}"):
        check_own_work(answer, masks.causal_mask)


def test_an_object_of_the_notebooks_own_class_is_not_equal_to_a_plain_value():
    class AlwaysEqual:
        def __eq__(self, other):
            return True

    AlwaysEqual.__module__ = "__main__"                  # as a notebook cell defines it
    for answer in (AlwaysEqual(), [AlwaysEqual()] * 3, {"a": AlwaysEqual()}):
        with pytest.raises(CheckFailed, match="object of the notebook's own class AlwaysEqual"):
            check_equal(answer, [0, 2, 4], "front")


def test_a_tensor_subclass_cannot_answer_the_comparison_itself():
    class Agreeable(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in ("ne", "__ne__"):
                return torch.zeros(torch.broadcast_shapes(*(a.shape for a in args)),
                                   dtype=torch.bool)
            if name in ("eq", "__eq__", "isclose"):
                return torch.ones(torch.broadcast_shapes(*(a.shape for a in args)),
                                  dtype=torch.bool)
            if name in ("allclose", "equal"):
                return True
            return super().__torch_function__(func, types, args, kwargs or {})

    wrong = torch.zeros(3).as_subclass(Agreeable)
    assert not bool((wrong.detach() != torch.ones(3)).any())     # unprotected, it agrees
    with pytest.raises(CheckFailed, match="3 of 3 elements differ"):
        check_equal(wrong, torch.ones(3), "values")
    with pytest.raises(CheckFailed, match="differ by more than"):
        check_close(wrong, torch.ones(3), "values")
