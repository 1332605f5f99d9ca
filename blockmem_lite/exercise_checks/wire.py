"""The data a graded notebook hands back to the grader: JSON that cannot carry code.

A graded kernel runs the student's code, so whatever it sends back is untrusted. It sends
only data: ``None``, booleans, numbers, strings, tensors (dtype, shape and raw bytes in
base64), dtypes, and tuples, lists and dicts of these. ``decode`` rebuilds them with the JSON
parser and ``torch.frombuffer``: no pickle, no import, no call of anything the text names.
Anything else (an object of the notebook's own class, a function) is refused when encoded,
with a message naming its type; a malformed or oversized text is refused when decoded.
"""

from __future__ import annotations

import base64
import json
import math

import numpy
import torch

MAX_CHARS = 256 << 20          # the largest text decoded (a reply is rarely above a few MB)
MAX_DEPTH = 32
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
    torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)}


class WireError(ValueError):
    """A value that is not plain data, or a text that is not what ``encode`` writes."""


def encode(value) -> str:
    """``value`` as JSON text; a WireError names the first part that is not data."""
    return json.dumps(_to_json(value, 0, "the value"), separators=(",", ":"))


def decode(text: str):
    """The value ``encode`` wrote; a WireError for anything else."""
    if not isinstance(text, str) or len(text) > MAX_CHARS:
        raise WireError(f"a reply of {len(text) if isinstance(text, str) else type(text)} "
                        f"characters is not allowed: expected JSON text of at most {MAX_CHARS}")
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise WireError(f"the reply is not JSON: {err}") from None
    return _from_json(raw, 0)


def _tensor_json(value: torch.Tensor, where: str) -> dict:
    if value.layout != torch.strided or value.is_nested:
        raise WireError(f"{where} is a {value.layout} tensor: only dense tensors are data")
    name = str(value.dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise WireError(f"{where} has dtype {value.dtype}: expected one of {', '.join(DTYPES)}")
    flat = value.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return {"t": "tensor", "dtype": name, "shape": list(value.shape),
            "data": base64.b64encode(raw).decode("ascii")}


def _to_json(value, depth: int, where: str):
    if depth > MAX_DEPTH:
        raise WireError(f"{where} is nested more than {MAX_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if abs(value) < 1 << 63 else {"t": "bigint", "text": str(value)}
    if isinstance(value, float):
        return value if math.isfinite(value) else {"t": "float", "text": repr(value)}
    if isinstance(value, (numpy.generic, numpy.ndarray)):
        return {"t": "numpy", "value": _tensor_json(torch.as_tensor(numpy.asarray(value)), where)}
    if isinstance(value, torch.Tensor):
        return _tensor_json(value, where)
    if isinstance(value, torch.dtype):
        return {"t": "dtype", "name": str(value).removeprefix("torch.")}
    if isinstance(value, (tuple, list)):           # torch.Size is a tuple
        items = [_to_json(v, depth + 1, f"{where}[{i}]") for i, v in enumerate(value)]
        return {"t": "list" if isinstance(value, list) else "tuple", "items": items}
    if isinstance(value, dict):
        keys = list(value)
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in keys):
            raise WireError(f"{where} is a dict with keys {keys[:5]!r}: only str or int keys")
        return {"t": "dict", "items": [[k, _to_json(v, depth + 1, f"{where}[{k!r}]")]
                                        for k, v in value.items()]}
    raise WireError(f"{where} is a {type(value).__module__}.{type(value).__qualname__}: "
                    "expected tensors, numbers, strings, None, or tuples, lists and dicts of them")


def _tensor_from(raw: dict) -> torch.Tensor:
    dtype, shape = DTYPES.get(raw.get("dtype")), raw.get("shape")
    if dtype is None or not isinstance(shape, list) or \
            not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise WireError(f"a tensor with dtype={raw.get('dtype')!r}, shape={shape!r} is not "
                        "allowed")
    try:
        data = base64.b64decode(raw.get("data", ""), validate=True)
    except (ValueError, TypeError):
        raise WireError("a tensor's data is not base64") from None
    count = math.prod(shape)
    if len(data) != count * torch.empty((), dtype=dtype).element_size():
        raise WireError(f"a tensor of shape {shape} and dtype {raw['dtype']} with "
                        f"{len(data)} bytes of data is not allowed")
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def _from_json(raw, depth: int):
    if depth > MAX_DEPTH:
        raise WireError(f"the reply is nested more than {MAX_DEPTH} levels deep")
    if raw is None or isinstance(raw, (bool, int, float, str)):
        return raw
    if isinstance(raw, dict):
        kind = raw.get("t")
        if kind == "tensor":
            return _tensor_from(raw)
        if kind == "numpy" and isinstance(raw.get("value"), dict):
            return _tensor_from(raw["value"]).numpy()
        if kind == "dtype" and raw.get("name") in DTYPES:
            return DTYPES[raw["name"]]
        if kind in ("bigint", "float") and isinstance(raw.get("text"), str):
            return _number(kind, raw["text"])
        if kind in ("list", "tuple") and isinstance(raw.get("items"), list):
            items = [_from_json(v, depth + 1) for v in raw["items"]]
            return items if kind == "list" else tuple(items)
        if kind == "dict" and isinstance(raw.get("items"), list):
            return _dict_from(raw["items"], depth)
    raise WireError(f"the reply holds {str(raw)[:80]!r}, which encode never writes")


def _number(kind: str, text: str):
    try:
        return int(text) if kind == "bigint" else float(text)
    except ValueError:
        raise WireError(f"{text[:40]!r} is not a number") from None


def _dict_from(items: list, depth: int) -> dict:
    out = {}
    for item in items:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int))
                and not isinstance(item[0], bool)):
            raise WireError(f"a dict entry {str(item)[:60]!r} is not allowed")
        out[item[0]] = _from_json(item[1], depth + 1)
    return out
