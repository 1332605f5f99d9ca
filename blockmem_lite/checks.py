"""Check helpers for notebooks and exercises: one ``OK ...`` line, or a precise failure.

Every helper prints exactly one line starting with ``OK `` when the check
passes, and raises ``CheckFailed`` (an ``AssertionError``) otherwise, with
what was expected, what was got and where they differ::

    check_shape(y, (B, T, None))            # None / -1 match any size
    check_close(mine, library, "attention output")
    check_causal(model, tokens)             # no output may see a later token

Failures are meant for a learner: they name the tensor, the index of the
worst element and the values there, or the earliest position that leaked.
Tensors, numpy arrays, numbers and nested lists are all read as values. A bad
argument (a negative tolerance, a str where a bool is needed) is a ValueError
``name=value is not allowed: expected ...``, not a CheckFailed.

An exercise's first check, that the answer does not call the kit's own version of it
(``check_own_work``), is in ``own_work.py``; a learner's layer plugged into a kit model and
trained beside it (``check_plugged_in``, ``swap_modules``) in ``plugged_in.py``. Such checks,
which word their own verdicts, build on five public pieces of this module: ``print_ok``,
``failure``, ``agrees`` (a verdict without a word), ``not_allowed`` and ``require_text``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence

import numpy
import torch

from blockmem_lite import registry

NEEDS_NUMBERS = "a tensor, array or number"


class CheckFailed(AssertionError):
    """A check did not hold; the message says expected vs got."""


AFTER_A_FAILED_CHECK = ("Fix the cell(s) above and run this check again. In the exercise "
                        "notebooks Run All goes on to the next exercise (their check cells are "
                        "tagged raises-exception); elsewhere it stops here: to go on, click the "
                        "next cell and use Run > Run Selected Cell and All Below.")


def show_check_failure(shell, etype, value, tb, tb_offset=None) -> None:
    """IPython's rendering of a CheckFailed: the check's message and what to do next, not a
    traceback through checks.py (the failure is in the student's cell, not in here)."""
    shell._showtraceback(etype, value, [f"CheckFailed: {value}", AFTER_A_FAILED_CHECK])


def _install_in_ipython() -> None:
    """Render CheckFailed briefly in a running IPython shell (a notebook); elsewhere nothing."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None and hasattr(shell, "set_custom_exc"):
        shell.set_custom_exc((CheckFailed,), show_check_failure)


ACTIVE_GUARDS: list = []     # guard.Guard objects watching the learner's code (check_own_work)


def print_ok(text: str) -> None:
    """Print the check's OK, unless a guard saw the learner's code reach a switched-off piece."""
    for guard in list(ACTIVE_GUARDS):
        guard.verdict()
    print(f"OK {text}")


def failure(name: str, problem: str, *details: str) -> CheckFailed:
    """The exception to raise: ``name: problem`` then one indented line per detail (and the
    notes of the guards watching the learner's code, e.g. an input changed in place)."""
    details += tuple(note for guard in ACTIVE_GUARDS for note in guard.notes)
    return CheckFailed("\n".join([f"{name}: {problem}"] + [f"  {d}" for d in details]))


def _short(value, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _shape_text(shape: Iterable) -> str:
    dims = ["*" if d is None or d == -1 else str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


# --- describing and validating arguments ----------------------------------------------------


def _is_array(value) -> bool:
    """A torch tensor or a numpy array / scalar (anything with ``__array__`` and a shape)."""
    return isinstance(value, torch.Tensor) or (hasattr(value, "__array__")
                                               and hasattr(value, "shape"))


def _describe(value) -> str:
    """``Tensor of shape (2, 3), dtype float32`` for arrays, the short repr otherwise."""
    if _is_array(value) and not isinstance(value, numbers.Number):
        dtype = str(value.dtype).replace("torch.", "")
        return f"{type(value).__name__} of shape {_shape_text(value.shape)}, dtype {dtype}"
    return _short(value, 60)


def _kind(value) -> str:
    """What a value is, for 'got ...': ``str 'abc'``, ``float 0.5``, ``ndarray of shape (2,)...``."""
    text = _describe(value)
    return text if _is_array(value) and not isinstance(value, numbers.Number) \
        else f"{type(value).__name__} {text}"


def not_allowed(arg: str, value, expected: str) -> ValueError:
    """The kit's error for a bad argument: ``arg=value is not allowed: expected ...``."""
    return ValueError(f"{arg}={_describe(value)} is not allowed: expected {expected}")


def require_text(arg: str, value, empty_ok: bool = False) -> None:
    if not isinstance(value, str) or not (value or empty_ok):
        raise not_allowed(arg, value, "a string" if empty_ok else "a non-empty string")


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _tolerance(arg: str, value, positive: bool = False) -> float:
    """``value`` as a float; ValueError unless it is a finite real number >= 0 (> 0)."""
    ok = (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value) and (value > 0 if positive else value >= 0))
    if not ok:
        raise not_allowed(arg, value, f"a finite number {'> 0' if positive else '>= 0'}")
    return float(value)


def _as_tensor(value, name: str, role: str) -> torch.Tensor:
    """A detached CPU tensor from a tensor, array, number or nested list; CheckFailed otherwise."""
    got = "got" if role == "got" else "the expected value is"
    if value is None:
        raise failure(name, f"{got} None, not {NEEDS_NUMBERS}",
                       "did the cell forget to return or assign the result?")
    if isinstance(value, torch.Tensor):
        if value.is_meta:
            raise failure(name, f"{got} a meta tensor, which holds no values",
                           "build it on a real device (cpu or cuda), not 'meta'")
        with torch._C.DisableTorchFunctionSubclass():   # a subclass's own ==, allclose: not used
            return value.detach().cpu().as_subclass(torch.Tensor)
    if isinstance(value, (str, bytes, dict, set)):
        raise failure(name, f"{got} {_kind(value)}, not {NEEDS_NUMBERS}")
    try:
        if _is_array(value):
            return torch.as_tensor(numpy.array(value))
        return torch.as_tensor(value, dtype=torch.float64) if _holds_python_floats(value) \
            else torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as err:
        raise failure(name, f"{got} {_kind(value)}, which cannot be read as numbers",
                       f"expected {NEEDS_NUMBERS}; {str(err).splitlines()[0]}") from None


def _holds_python_floats(value) -> bool:
    """A Python float, or a (nested) list / tuple with one: read as float64, as Python holds it."""
    if isinstance(value, float):
        return True
    return isinstance(value, (list, tuple)) and any(_holds_python_floats(v) for v in value)


def _index_text(flat_index: int, shape: torch.Size) -> str:
    if len(shape) == 0:
        return "()"
    index = []
    for size in reversed(shape):
        index.append(flat_index % size)
        flat_index //= size
    return str(tuple(reversed(index)))


# --- shape, values, truth -------------------------------------------------------------------


def _expected_shape(expected) -> tuple:
    """``expected`` as a tuple of ints / None; ValueError for anything else."""
    if _is_int(expected):
        expected = (expected,)
    rule = "a tuple of sizes, each an integer >= 0 or None / -1 for 'any size'"
    if not isinstance(expected, (tuple, list, torch.Size)):
        raise not_allowed("expected", expected, rule)
    if not all(d is None or (_is_int(d) and d >= -1) for d in expected):
        raise not_allowed("expected", tuple(expected), rule)
    return tuple(None if d is None else int(d) for d in expected)


def check_shape(x, expected: Sequence[int | None], name: str = "tensor") -> None:
    """``x.shape`` equals ``expected``; ``None`` or ``-1`` in ``expected`` match any size."""
    expected = _expected_shape(expected)
    require_text("name", name)
    if x is None:
        raise failure(name, "got None, expected a tensor of shape " + _shape_text(expected),
              "did the cell forget to return or assign the result?")
    if not _is_array(x):
        raise failure(name, f"got an object of type {type(x).__name__}, which has no shape",
              f"expected a tensor of shape {_shape_text(expected)}")
    got = tuple(int(d) for d in x.shape)
    if len(got) != len(expected):
        raise failure(name, "wrong number of dimensions",
              f"expected {len(expected)} dims: {_shape_text(expected)}",
              f"got      {len(got)} dims: {_shape_text(got)}")
    wrong = [i for i, (g, e) in enumerate(zip(got, expected, strict=True))
             if e not in (None, -1) and g != e]
    if wrong:
        raise failure(name, "wrong shape",
              f"expected {_shape_text(expected)}",
              f"got      {_shape_text(got)}",
              *(f"dim {i}: expected {expected[i]}, got {got[i]}" for i in wrong))
    print_ok(f"{name}: shape {_shape_text(got)}")


# The defaults of torch.testing.assert_close, per dtype: (rtol, atol). A comparison of two
# dtypes uses the looser pair, so float32 against a float64 reference is held to float32's.
DEFAULT_TOLERANCES = {
    torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7), torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5), torch.complex128: (1e-7, 1e-7),
}


def default_tolerances(*dtypes: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` that ``torch.testing.assert_close`` uses for these dtypes (0, 0 for
    integers and bools): the loosest of them."""
    pairs = [DEFAULT_TOLERANCES.get(d, (0.0, 0.0)) for d in dtypes]
    return max(r for r, _ in pairs), max(a for _, a in pairs)


def _tolerances(g: torch.Tensor, e: torch.Tensor, atol, rtol) -> tuple[float, float]:
    """``(atol, rtol)``: each as given, or the dtype default when None."""
    default_rtol, default_atol = default_tolerances(g.dtype, e.dtype)
    atol = default_atol if atol is None else _tolerance("atol", atol)
    rtol = default_rtol if rtol is None else _tolerance("rtol", rtol)
    return atol, rtol


def _all_close(g: torch.Tensor, e: torch.Tensor, atol: float, rtol: float) -> bool:
    """The verdict, delegated to ``torch.testing.assert_close`` (NaN matches NaN)."""
    try:
        torch.testing.assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True, check_dtype=False,
                                   check_device=False, check_layout=False, check_stride=False)
    except AssertionError:
        return False
    return True


def check_close(got, expected, name: str = "values", atol: float | None = None,
                rtol: float | None = None) -> None:
    """Elementwise ``|got - expected| <= atol + rtol * |expected|``; NaN only where expected is NaN.

    The verdict is ``torch.testing.assert_close``'s; so are the defaults, which follow the
    dtypes: float64 is held to rtol = atol = 1e-7, float32 to rtol 1.3e-6 and atol 1e-5, and a
    float32 result against a float64 reference to float32's (the looser). Give ``atol`` or
    ``rtol`` to loosen or tighten one of them; the other keeps its default. Python floats are
    read as float64. Complex values are compared as complex numbers. On failure the message
    gives the number of bad elements, the max abs diff, its index and both values there, plus
    the dtypes.
    """
    if atol is not None:
        _tolerance("atol", atol)
    if rtol is not None:
        _tolerance("rtol", rtol)
    require_text("name", name)
    g = _as_tensor(got, name, "got")
    e = _as_tensor(expected, name, "expected")
    atol, rtol = _tolerances(g, e, atol, rtol)
    dtypes = f"dtypes: got {str(g.dtype).replace('torch.', '')}, " \
             f"expected {str(e.dtype).replace('torch.', '')}"
    if g.shape != e.shape:
        raise failure(name, "shapes differ, so the values cannot be compared",
              f"expected shape {_shape_text(e.shape)}", f"got shape      {_shape_text(g.shape)}",
              dtypes)
    if g.numel() == 0:
        print_ok(f"{name}: close (empty, shape {_shape_text(g.shape)})")
        return
    wide = torch.complex128 if g.is_complex() or e.is_complex() else torch.float64
    g64, e64 = g.to(wide), e.to(wide)
    close = torch.isclose(g64, e64, rtol=rtol, atol=atol, equal_nan=True)
    diff = (g64 - e64).abs()
    diff = torch.where(close & diff.isnan(), torch.zeros_like(diff), diff)  # NaN == NaN is fine
    ranked = diff.nan_to_num(nan=float("inf")).flatten()
    worst = int(ranked.argmax())
    max_diff = diff.flatten()[worst].item()
    if not _all_close(g, e, atol, rtol):
        n_bad = max(int((~close).sum()), 1)
        raise failure(name, f"{n_bad} of {g.numel()} values differ by more than "
                    f"atol={atol:g} + rtol={rtol:g} * |expected|",
              f"max abs diff {max_diff:.3g} at index {_index_text(worst, g.shape)}: "
              f"got {g64.flatten()[worst].item():.6g}, expected {e64.flatten()[worst].item():.6g}",
              f"shape {_shape_text(g.shape)}; {dtypes}")
    print_ok(f"{name}: close, max abs diff {max_diff:.2g} (atol={atol:g}, rtol={rtol:g}), "
        f"shape {_shape_text(g.shape)}")


def _check_equal_tensors(got, expected, name: str) -> None:
    """Same shape and every element equal (NaN matches NaN)."""
    g = _as_tensor(got, name, "got")
    e = _as_tensor(expected, name, "expected")
    if g.shape != e.shape:
        raise failure(name, "shapes differ", f"expected shape {_shape_text(e.shape)}",
              f"got shape      {_shape_text(g.shape)}")
    differ = ((g != e) & ~(g.isnan() & e.isnan())).flatten()
    if bool(differ.any()):
        first = int(differ.nonzero()[0])
        raise failure(name, f"{int(differ.sum())} of {g.numel()} elements differ",
              f"first at index {_index_text(first, g.shape)}: got "
              f"{g.flatten()[first].item()!r}, expected {e.flatten()[first].item()!r}")
    print_ok(f"{name}: equal, shape {_shape_text(g.shape)}")


def _notebook_object(value, depth: int = 3):
    """An object of a class the notebook defined, in ``value`` or the containers in it."""
    if type(value).__module__ == "__main__":
        return value
    if depth and isinstance(value, (list, tuple, set, frozenset, dict)):
        items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        return next((o for o in map(lambda v: _notebook_object(v, depth - 1), items)
                     if o is not None), None)
    return None


def _plain_equal(got, expected, name: str) -> bool:
    """``got == expected`` as one bool (NaN matches NaN); CheckFailed if it is not one."""
    if isinstance(got, float) and isinstance(expected, float) and math.isnan(got) \
            and math.isnan(expected):
        return True
    own = _notebook_object(got)
    if own is not None and _notebook_object(expected) is None:        # its own __eq__ decides
        raise failure(name, f"got an object of the notebook's own class {type(own).__name__}",
                       f"expected {_kind(expected)}: return the values themselves")
    try:
        return bool(got == expected)
    except (TypeError, ValueError, RuntimeError) as err:
        raise failure(name, f"cannot compare got {_kind(got)} with expected {_kind(expected)}",
                       f"{str(err).splitlines()[0]}; pass tensors or arrays to compare them "
                       "element by element") from None


def agrees(got, expected, name: str, atol: float | None = None,
           rtol: float | None = None) -> bool:
    """The verdict ``check_close`` (tensors, arrays, floats: same shape, within the
    tolerances) or ``check_equal`` (anything else) would give, without a word printed;
    CheckFailed when the two cannot be compared. For checks that word their own verdict."""
    if _is_array(got) or _is_array(expected) or _reals_with_a_float(got, expected):
        g, e = _as_tensor(got, name, "got"), _as_tensor(expected, name, "expected")
        return g.shape == e.shape and _all_close(g, e, *_tolerances(g, e, atol, rtol))
    return _plain_equal(got, expected, name)


def _reals_with_a_float(*values) -> bool:
    """Real numbers (not bools), one of them a float: compared within a tolerance."""
    real = all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values)
    return real and any(isinstance(v, float) for v in values)


def check_equal(got, expected, name: str = "value") -> None:
    """Exact equality: tensors and numpy arrays (same shape, every element) or plain values."""
    require_text("name", name)
    if _is_array(got) or _is_array(expected):
        _check_equal_tensors(got, expected, name)
        return
    if not _plain_equal(got, expected, name):
        hint = ["did the cell forget to return or assign the result?"] if got is None else []
        raise failure(name, "not equal", f"expected {_short(expected)}", f"got      {_short(got)}",
                       *hint)
    print_ok(f"{name}: equal to {_short(expected, 60)}")


def _truth(condition) -> bool:
    """A bool, or a one-element bool tensor / array, as a bool; ValueError for anything else."""
    if isinstance(condition, bool):
        return condition
    if _is_array(condition) and str(condition.dtype) in ("torch.bool", "bool"):
        if math.prod(condition.shape) != 1:
            raise not_allowed("condition", condition, "a bool or a one-element tensor "
                               "(use .all() or .any())")
        return bool(condition)
    hint = "; did the expression forget to return a value?" if condition is None else ""
    raise not_allowed("condition", condition,
                       f"a bool such as a comparison (loss < 1.0) or bool((x == 0).all()){hint}")


def check_true(condition, message: str, detail: str = "") -> None:
    """``condition`` (a bool or a one-element bool tensor / array) holds; ``message`` says what
    it means (printed after ``OK``)."""
    require_text("message", message)
    require_text("detail", detail, empty_ok=True)
    if not _truth(condition):
        raise failure("check", f"expected: {message}", *([detail] if detail else []))
    print_ok(message)


# --- causality ------------------------------------------------------------------------------


def _block_sizes(model, block_sizes) -> list[int]:
    """The lengths whose boundaries to probe: given, or the mechanism's ``boundary`` knobs."""
    if block_sizes is not None:
        return _int_list("block_sizes", block_sizes, minimum=1)
    cfg = getattr(model, "cfg", None)
    arch = getattr(cfg, "arch", None)
    fields = registry.boundary_fields(arch) if arch in registry.names() else \
        {f for name in registry.names() for f in registry.boundary_fields(name)}   # duck-typed
    found = [getattr(cfg, f) for f in sorted(fields) if hasattr(cfg, f)]
    return [int(s) for v in found for s in (v if isinstance(v, (list, tuple)) else [v]) if s]


def _int_list(arg: str, value, minimum: int) -> list[int]:
    """An int or a sequence of ints, each >= ``minimum``, as a list; ValueError otherwise."""
    values = [value] if _is_int(value) else value
    if not isinstance(values, (list, tuple, range)) or \
            not all(_is_int(v) and v >= minimum for v in values):
        raise not_allowed(arg, value, f"an integer >= {minimum} or a list of them")
    return [int(v) for v in values]


def _as_tokens(tokens) -> torch.Tensor:
    """``tokens`` (tensor, array or nested list) as a tensor (B, T) of ids or (B, T, D) floats."""
    rule = "a tensor (B, T) of integer ids or (B, T, D) of floats"
    if not isinstance(tokens, torch.Tensor) and (_is_array(tokens) or isinstance(tokens, list)):
        try:
            tokens = torch.as_tensor(numpy.array(tokens))
        except (TypeError, ValueError, RuntimeError):
            raise not_allowed("tokens", tokens, rule) from None
    if not isinstance(tokens, torch.Tensor) or tokens.dim() < 2 or tokens.dtype == torch.bool \
            or tokens.is_complex():
        raise not_allowed("tokens", tokens, rule)
    return tokens


def default_probes(seq_len: int, block_sizes: Iterable[int] = ()) -> list[int]:
    """Probe positions: 0, T/4, T/2, T-2, and L-1, L, 2L-1 for each block size L."""
    if not _is_int(seq_len) or seq_len < 2:
        raise not_allowed("seq_len", seq_len, "an integer >= 2 (a probe needs a later token)")
    block_sizes = _int_list("block_sizes", list(block_sizes or ()), 1)
    probes = {0, seq_len // 4, seq_len // 2, seq_len - 2}
    for size in block_sizes:
        probes |= {size - 1, size, 2 * size - 1}
    return sorted(p for p in probes if 0 <= p <= seq_len - 2)


def _outputs(model_or_fn: Callable, tokens: torch.Tensor) -> torch.Tensor:
    out = model_or_fn(tokens)
    if hasattr(out, "logits"):
        out = out.logits
    elif isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"model_or_fn returned {type(out).__name__}: expected a tensor "
                         "(B, T, ...), a tuple starting with one, or an output with .logits")
    return torch.view_as_real(out) if out.is_complex() else out


def _perturb_after(tokens: torch.Tensor, p: int, vocab_size: int | None,
                   generator: torch.Generator) -> torch.Tensor:
    """A copy of ``tokens`` (B, T, ...) whose entries at time > p all differ from the original."""
    changed = tokens.clone()
    future = tokens[:, p + 1:]
    if tokens.dtype.is_floating_point:
        noise = torch.randn(future.shape, generator=generator, dtype=tokens.dtype)
        changed[:, p + 1:] = future + 1.0 + noise.abs().to(tokens.device)
    else:
        shift = torch.randint(1, vocab_size, future.shape, generator=generator)
        changed[:, p + 1:] = (future + shift.to(tokens.device)) % vocab_size
    return changed


def check_causal(model_or_fn: Callable, tokens: torch.Tensor,
                 positions: Sequence[int] | None = None, atol: float = 1e-5,
                 vocab_size: int | None = None, require_teeth: bool = True, seed: int = 0,
                 block_sizes: int | Sequence[int] | None = None) -> None:
    """No output may depend on a later input.

    ``model_or_fn`` is a LanguageModel (its ``.logits`` are used) or any callable
    mapping ``tokens`` (B, T) ids, or (B, T, D) floats, to outputs (B, T, ...).
    For each probe position p every input after p is replaced; outputs at
    positions <= p must move by less than ``atol``. With ``require_teeth`` some
    output after p must move by more than ``10 * atol``, otherwise the check
    could not catch anything (e.g. the model ignores its input).

    Probes default to 0, T/4, T/2, T-2 and the block boundaries L-1, L, 2L-1 of
    ``block_sizes`` (default: the model config's block/segment/chunk sizes).
    Runs in eval mode under ``no_grad``; the training flag is restored.
    """
    if not callable(model_or_fn):
        raise not_allowed("model_or_fn", model_or_fn, "a model or a function mapping tokens "
                           "(B, T) to outputs (B, T, ...)")
    tokens = _as_tokens(tokens)
    atol = _tolerance("atol", atol, positive=True)
    if vocab_size is not None and not (_is_int(vocab_size) and vocab_size >= 2):
        raise not_allowed("vocab_size", vocab_size, "an integer >= 2 (or None: from the model)")
    seq_len = tokens.shape[1]
    if seq_len < 2:
        raise ValueError(f"tokens with T={seq_len} are not allowed: check_causal needs T >= 2")
    if tokens.numel() == 0:
        raise not_allowed("tokens", tokens, "at least one sequence (B >= 1) of T >= 2 inputs "
                                            "(each of D >= 1 features for floats)")
    if not tokens.dtype.is_floating_point:
        cfg_vocab = getattr(getattr(model_or_fn, "cfg", None), "vocab_size", None)
        vocab_size = vocab_size or cfg_vocab or max(int(tokens.max()) + 1, 2)
    in_range = f"a non-empty list of positions in [0, {seq_len - 2}]"
    probes = sorted(set(_int_list("positions", positions, 0))) if positions is not None else \
        default_probes(seq_len, _block_sizes(model_or_fn, block_sizes))
    if not probes or probes[-1] > seq_len - 2:
        raise not_allowed("positions", positions, in_range)
    module = model_or_fn if isinstance(model_or_fn, torch.nn.Module) else None
    if module is not None:
        params = next(module.parameters(), None)
        tokens = tokens.to(params.device) if params is not None else tokens
    was_training = module.training if module is not None else False
    generator = torch.Generator().manual_seed(seed)
    try:
        if module is not None:
            module.eval()
        with torch.no_grad():
            base = _outputs(model_or_fn, tokens)
            if base.dim() < 2 or base.shape[:2] != tokens.shape[:2]:
                raise ValueError(f"outputs of shape {tuple(base.shape)} are not allowed: "
                                 f"check_causal needs (B, T, ...) = ({tokens.shape[0]}, {seq_len}, "
                                 "...) with time on dim 1; wrap the function to move it there")
            _refuse_non_finite(base, tokens)
            moved = []
            for p in probes:
                changed = _outputs(model_or_fn, _perturb_after(tokens, p, vocab_size, generator))
                _refuse_non_finite_after(changed, p)
                delta = (changed.float() - base.float()).abs()
                moved.append(delta.transpose(0, 1).reshape(seq_len, -1).amax(dim=1))  # (T,)
    finally:
        if module is not None:
            module.train(was_training)
    _judge_causality(probes, moved, atol, require_teeth)


def _first_non_finite(values: torch.Tensor) -> tuple[int, str] | None:
    """(position, 'NaN' / 'inf' / '-inf') of the earliest non-finite entry of ``values``
    (B, T, ...) along time (dim 1); None when all are finite."""
    flat = values.float().transpose(0, 1).reshape(values.shape[1], -1)         # (T, B * ...)
    bad_at = ~torch.isfinite(flat).all(dim=1)                                  # (T,)
    if not bool(bad_at.any()):
        return None
    i = int(bad_at.nonzero()[0])
    row = flat[i]
    return i, "NaN" if bool(row.isnan().any()) else "inf" if bool((row == math.inf).any()) \
        else "-inf"


def _refuse_non_finite(base: torch.Tensor, tokens: torch.Tensor) -> None:
    """CheckFailed if the unperturbed outputs hold NaN or inf: no change could then be
    measured (inf - inf is NaN). Names the tokens' own non-finite entry where they hold one."""
    found = _first_non_finite(base)
    if found is None:
        return
    i, kind = found
    cause = _first_non_finite(tokens) if tokens.dtype.is_floating_point else None
    held = f" (the tokens hold {cause[1]} at position {cause[0]})" if cause else ""
    raise failure("causality", f"the outputs are {kind} at position {i} before any input was "
                  f"changed{held}", f"expected finite outputs; fix the {kind} first, then the "
                  "check can tell whether a later input leaks")


def _refuse_non_finite_after(changed: torch.Tensor, p: int) -> None:
    """CheckFailed if the outputs (B, T, ...) went NaN or inf when the inputs after ``p``
    changed: at a position <= p that is a leak (``.leak`` set), later the change cannot be
    measured."""
    found = _first_non_finite(changed)
    if found is None:
        return
    i, kind = found
    if i <= p:
        error = failure("causality", f"output at position {i} went {kind} when only the inputs "
                        f"after position {p} were changed", f"expected: outputs at positions "
                        f"0..{p} unchanged and finite", f"so position {i} sees an input from its "
                        "future")
        error.leak = (i, p)     # (position, probe): for a caller that explains it
        raise error
    raise failure("causality", f"output at position {i} went {kind} when the inputs after "
                  f"position {p} were changed", "expected finite outputs for any input (the "
                  "check replaces every input after the probe), so that how far each output "
                  "moved can be measured")


def _judge_causality(probes: list[int], moved: list[torch.Tensor], atol: float,
                     require_teeth: bool) -> None:
    """``moved[k]`` (T,): how far each output moved when the inputs after ``probes[k]`` changed."""
    worst_past, least_future = 0.0, float("inf")
    for p, delta in zip(probes, moved, strict=True):
        past, future = delta[:p + 1], delta[p + 1:]
        leaking = past >= atol
        if bool(leaking.any()):
            i = int(leaking.nonzero()[0])
            error = failure(
                "causality",
                f"output at position {i} changed by {past[i].item():.3g} when only the inputs "
                f"after position {p} were changed",
                f"expected: outputs at positions 0..{p} unchanged (max change < atol={atol:g})",
                f"got: {int(leaking.sum())} of these {p + 1} positions changed; the earliest is "
                f"{i}, so position {i} sees an input from its future",
                f"probe positions: {probes}")
            error.leak = (i, p)     # (position, probe): for a caller that explains it
            raise error
        if require_teeth and not future.max().item() > 10 * atol:
            raise failure(
                "causality",
                f"the check has no teeth: changing every input after position {p} moved no "
                f"later output by more than 10*atol={10 * atol:g} "
                f"(largest change {future.max().item():.3g})",
                "the model or function seems to ignore its input, so a leak could not be seen",
                "pass require_teeth=False only if that is intended")
        worst_past = max(worst_past, past.max().item())
        least_future = min(least_future, future.max().item())
    print_ok(f"causal: outputs at positions <= p unchanged when inputs after p change "
        f"(probes {probes}; max change {worst_past:.2g} < atol={atol:g}; "
        f"later outputs moved by >= {least_future:.2g})")


_install_in_ipython()
