"""Plain values across the sandbox boundary: builtin values only, as JSON.

The sandboxed program's interpreter encodes the values of the expressions an assert test compares with
:func:`encode_value`; the trusted side rebuilds them with :func:`decode_value`, which accepts nothing but builtin
values (``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``list``, ``tuple``, ``set``,
``frozenset``, ``dict``), so no object of the program's (an ``__eq__`` that is always true, a subclass of ``int``)
can reach a comparison. The encoder runs in the untrusted interpreter and may be tampered with: that only changes
which values it claims, and the decoder checks the shape of whatever arrives.

The sandbox's interpreters run with ``-I -S`` and cannot import the package: the sandbox's first process
(:mod:`grpo_family.rewards._sandbox_child`) executes this file by path, and the code reward's judge receives it as
source text. So it uses the standard library only and defines nothing but these functions.
"""

_MAX_DEPTH = 100
_TAGGED = ("float", "complex", "bytes", "tuple", "set", "frozenset", "dict")


def encode_value(value, depth=0):
    """A JSON-ready form of a builtin value; TypeError for anything else (exact types: no subclasses)."""
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply")
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if kind is float:
        return {"float": repr(value)}
    if kind is complex:
        return {"complex": [repr(value.real), repr(value.imag)]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is list:
        return [encode_value(item, depth + 1) for item in value]
    if kind is tuple or kind is set or kind is frozenset:
        return {kind.__name__: [encode_value(item, depth + 1) for item in value]}
    if kind is dict:
        return {"dict": [[encode_value(k, depth + 1), encode_value(v, depth + 1)] for k, v in value.items()]}
    raise TypeError(f"not a plain builtin value: {kind.__name__}")


def decode_value(data, depth=0):
    """The builtin value :func:`encode_value` encoded; ValueError for anything not of that shape."""
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply")
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is str:
        return data
    if kind is list:
        return [decode_value(item, depth + 1) for item in data]
    if kind is not dict or len(data) != 1:
        raise ValueError(f"not an encoded value: {kind.__name__}")
    ((tag, payload),) = data.items()
    if tag not in _TAGGED:
        raise ValueError(f"unknown tag {tag!r}")
    try:
        if tag == "float" and type(payload) is str:
            return float(payload)
        if tag == "complex" and type(payload) is list and len(payload) == 2 and all(type(p) is str for p in payload):
            return complex(float(payload[0]), float(payload[1]))
        if tag == "bytes" and type(payload) is str:
            return bytes.fromhex(payload)
        if type(payload) is list:
            items = [decode_value(item, depth + 1) for item in payload]
            if tag == "tuple":
                return tuple(items)
            if tag == "set":
                return set(items)
            if tag == "frozenset":
                return frozenset(items)
            if tag == "dict" and all(type(pair) is list and len(pair) == 2 for pair in items):
                return {key: value for key, value in items}
    except (TypeError, OverflowError) as e:  # an unhashable set member or dict key, a float out of range
        raise ValueError(str(e)) from e
    raise ValueError(f"malformed {tag} payload")
