"""Plain values across the sandbox's channel: one JSON line each way, never pickle (imports nothing from llmx; the
sandbox's child imports it by path before it confines itself).

``encode`` turns None, bool, int, float (NaN and infinities included), str, bytes, complex, list, tuple, set,
frozenset, dict (any plain keys) and numeric numpy arrays and scalars into JSON; ``decode`` rebuilds them as the
builtin types only (numpy arrays stay arrays), so a value that crosses cannot carry behaviour: an object whose
``__eq__`` says yes to everything arrives, if at all, as the plain value its type's encoding gives. Tagged forms are
one-key dicts: ``{"t": [...]}`` tuple, ``{"s"|"f": [...]}`` set / frozenset, ``{"d": [[k, v], ...]}`` dict,
``{"b": base64}`` bytes, ``{"c": [re, im]}`` complex, ``{"a": [dtype, shape, base64]}`` array.
"""

from __future__ import annotations

import base64
import json
import math

DEPTH = 64
COLLISIONS = 64  # hash collisions allowed among a set's or dict's keys
ARRAY_KINDS = "biufc"  # bool, signed, unsigned, float, complex: arrays of anything else (objects, strings) refused


class NotPlain(TypeError):
    """A value the channel does not carry; the message names its type."""


def dumps(value: object) -> str:
    return json.dumps(encode(value), allow_nan=True, separators=(",", ":"))


def loads(text: str | bytes) -> object:
    return decode(json.loads(text))


def encode(value: object, depth: int = 0) -> object:
    if depth > DEPTH:
        raise NotPlain(f"a value nested deeper than {DEPTH}")
    if value is None or type(value) is bool:
        return value
    if isinstance(value, str):  # a subclass's own methods are not called: the exact str, int or float goes
        return str.__str__(value)
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, (bytes, bytearray)):
        return {"b": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, complex):
        return {"c": [value.real, value.imag]}
    items = lambda xs: [encode(x, depth + 1) for x in xs]  # noqa: E731
    if isinstance(value, list):
        return items(value)
    if isinstance(value, tuple):
        return {"t": items(value)}
    if isinstance(value, frozenset):
        return {"f": items(value)}
    if isinstance(value, set):
        return {"s": items(value)}
    if isinstance(value, dict):
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    if isinstance(kind, str) and kind in ARRAY_KINDS and type(value).__module__ == "numpy":
        if getattr(value, "ndim", None) == 0 and type(value).__name__ != "ndarray":  # a numpy scalar
            return encode(value.item(), depth)
        return {"a": [value.dtype.str, list(value.shape), base64.b64encode(value.tobytes(order="C")).decode()]}
    raise NotPlain(f"a {type(value).__module__}.{type(value).__qualname__} is not a plain value")


def decode(tree: object, depth: int = 0) -> object:
    if depth > DEPTH:
        raise ValueError(f"a value nested deeper than {DEPTH}")
    if tree is None or type(tree) in (bool, int, float, str):
        return tree
    if type(tree) is list:
        return [decode(x, depth + 1) for x in tree]
    if type(tree) is not dict or len(tree) != 1:
        raise ValueError("a malformed value")
    (tag, body), = tree.items()
    if tag in ("t", "s", "f") and type(body) is list:
        xs = [decode(x, depth + 1) for x in body]
        return tuple(xs) if tag == "t" else set(_spread(xs)) if tag == "s" else frozenset(_spread(xs))
    if tag == "d" and type(body) is list and all(type(kv) is list and len(kv) == 2 for kv in body):
        pairs = [(decode(k, depth + 1), decode(v, depth + 1)) for k, v in body]
        _spread([k for k, _ in pairs])
        return dict(pairs)
    if tag == "b" and type(body) is str:
        return base64.b64decode(body, validate=True)
    if tag == "c" and type(body) is list and len(body) == 2 and all(type(x) in (int, float) for x in body):
        return complex(*body)
    if tag == "a" and type(body) is list and len(body) == 3:
        return _array(*body)
    raise ValueError(f"a malformed value (tag {str(tag)[:20]!r})")


def _spread(keys: list) -> list:
    """Keys whose hashes collide beyond chance are refused before they go into a set or dict: integer hashes are not
    randomised, so ``k * (2**61 - 1)`` all hash alike and inserting them takes quadratic time."""
    if len(keys) - len({hash(k) for k in keys}) > COLLISIONS:
        raise ValueError("keys whose hashes collide (a set or dict built to be slow)")
    return keys


def _array(dtype: object, shape: object, data: object):
    import numpy as np

    if type(dtype) is not str or type(shape) is not list or type(data) is not str:
        raise ValueError("a malformed array")
    dt = np.dtype(dtype)
    if dt.kind not in ARRAY_KINDS or dt.hasobject or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"an array of {dtype} is not a plain value")
    raw = base64.b64decode(data, validate=True)
    if len(raw) != dt.itemsize * math.prod(shape):
        raise ValueError("an array whose data does not match its shape")
    return np.frombuffer(raw, dtype=dt).reshape(shape).copy()
