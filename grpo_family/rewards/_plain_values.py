"""Plain values across the sandbox boundary: builtin values only, as JSON.

The code reward's judge (the interpreter that runs a test) and the program's interpreter exchange the arguments and
results of the test's calls into the program as JSON built by :class:`Wire`. Only builtin values travel by value:
``None``, ``bool``, ``int`` (any size: beyond 63 bits as hex, which no digit limit applies to), ``float``,
``complex``, ``str``, ``bytes``, ``bytearray``, ``list``, ``tuple``, ``set``, ``frozenset``, ``dict``, and the
standard library's ``collections.Counter`` / ``OrderedDict`` / ``defaultdict`` / ``deque`` (so a ``Counter``
compares with a dict literal as in plain Python); a subclass of a builtin that keeps the builtin's ``__eq__`` and
``__hash__`` (an ``IntEnum``, a ``namedtuple``) travels as that builtin. Anything else of the program's (an object
whose ``__eq__`` is always true, an ``int`` subclass equal to everything, a function, a generator) travels as a
*reference* only: the judge gets an opaque stand-in that it can call or read attributes from (each of those a
round trip to the program), and that compares equal to nothing but itself.

Object identity is kept within a test: every mutable container carries an ``id``, an object sent again is sent as
``{"ref": id}`` within a message and with its current contents in a later message, and the receiving side updates
its own copy in place. So ``f(a) is a``, ``g() is g()`` for a cached object, and a list sorted in place by the
program and checked by a later assert behave as they do in plain Python.

The format (JSON): ``null``/``true``/``false``/strings/integers below 2**63 as themselves; ``{"int": hex}``,
``{"float": repr}``, ``{"complex": [repr, repr]}``, ``{"bytes": hex}``, ``{"tuple": [...]}``,
``{"frozenset": [...]}``; mutable containers ``{"list" | "set" | "deque": [...], "id": k}``,
``{"dict" | "Counter" | "OrderedDict" | "defaultdict": [[key, value], ...], "id": k}``, ``{"bytearray": hex,
"id": k}`` (``id`` absent without identity tracking); ``{"ref": k}``; program objects ``{"handle": k}`` and
``{"name": "f"}``. Decoding checks the shape of everything and bounds the nesting depth; the sizes are bounded by
whoever reads the message.

The sandbox's interpreters run with ``-I -S`` and cannot import the package: the sandbox's first process
(:mod:`grpo_family.rewards._sandbox_child`) executes this file by path. So it uses the standard library only.
"""

import collections

_MAX_DEPTH = 200
_SMALL_INT = 1 << 63
_MUTABLE = {
    list: "list",
    set: "set",
    collections.deque: "deque",
    dict: "dict",
    collections.Counter: "Counter",
    collections.OrderedDict: "OrderedDict",
    collections.defaultdict: "defaultdict",
    bytearray: "bytearray",
}
_MUTABLE_BY_TAG = {tag: kind for kind, tag in _MUTABLE.items()}
_PAIRS = frozenset({"dict", "Counter", "OrderedDict", "defaultdict"})
_IMMUTABLE = frozenset({"int", "float", "complex", "bytes", "tuple", "frozenset"})
# A subclass that keeps its base's comparison travels as the base (an IntEnum as an int, a namedtuple as a tuple).
_BASES = (int, float, str, bytes, tuple, frozenset, list, set, dict)


class Wire:
    """One side's end of the value channel of one test (see the module docstring).

    Args:
        identity: track object identity across messages (mutable containers get ids; see the module docstring).
        step: +1 or -1: the sign of the ids this side assigns (the judge counts up, the program down).
        export: ``export(obj)`` gives the reference (``{"handle": k}`` or ``{"name": n}``) to send for an object
            that is not a plain value, or None, which makes :meth:`encode` raise TypeError.
        resolve: ``resolve(reference)`` gives the local object for a received ``handle`` / ``name``; None rejects
            references (ValueError).
        max_depth: deepest nesting encoded or decoded (ValueError beyond).
    """

    def __init__(self, *, identity=True, step=1, export=None, resolve=None, max_depth=_MAX_DEPTH):
        self.identity = identity
        self.step = step
        self.export = export
        self.resolve = resolve
        self.max_depth = max_depth
        self.objects = {}  # id -> object (kept alive, so Python's id() of each stays unique)
        self.ids = {}  # id(object) -> id
        self._next = step

    # ------------------------------------------------------------------------------------------------ encoding

    def encode(self, values):
        """JSON-ready forms of ``values`` (a list), as one message: an object met twice is a ``ref`` the second
        time, and every known mutable object is sent with its current contents the first time."""
        seen = set()
        return [self._encode(value, 0, seen) for value in values]

    def _encode(self, value, depth, seen):
        if depth > self.max_depth:
            raise ValueError("value nested too deeply")
        kind = type(value)
        if value is None or kind is bool or kind is str:
            return value
        if kind is int:
            return value if -_SMALL_INT < value < _SMALL_INT else {"int": format(value, "x")}
        if kind is float:
            return {"float": repr(value)}
        if kind is complex:
            return {"complex": [repr(value.real), repr(value.imag)]}
        if kind is bytes:
            return {"bytes": value.hex()}
        if kind is tuple or kind is frozenset:
            return {kind.__name__: [self._encode(item, depth + 1, seen) for item in value]}
        tag = _MUTABLE.get(kind)
        if tag is not None:
            return self._encode_mutable(value, tag, depth, seen)
        for base in _BASES:
            if isinstance(value, base) and kind.__eq__ is base.__eq__ and kind.__hash__ is base.__hash__:
                return self._encode(base(value), depth, seen)
        reference = self.export(value) if self.export is not None else None
        if reference is None:
            raise TypeError(f"not a plain builtin value: {kind.__name__}")
        return reference

    def _encode_mutable(self, value, tag, depth, seen):
        key = id(value)
        if self.identity:
            if key in seen:
                return {"ref": self.ids[key]}
            seen.add(key)
            if key not in self.ids:
                self.ids[key] = self._next
                self.objects[self._next] = value
                self._next += self.step
        if tag == "bytearray":
            contents = value.hex()
        elif tag in _PAIRS:
            items = dict.items(value)
            contents = [[self._encode(k, depth + 1, seen), self._encode(v, depth + 1, seen)] for k, v in items]
        else:
            contents = [self._encode(item, depth + 1, seen) for item in value]
        return {tag: contents, "id": self.ids[key]} if self.identity else {tag: contents}

    # ------------------------------------------------------------------------------------------------ decoding

    def decode(self, data):
        """The values of one message (a list of encoded values); ValueError for anything not of the format. An
        ``id`` this side knows updates that object in place (the other side's current contents)."""
        if type(data) is not list:
            raise ValueError("a message is a list of values")
        return [self._decode(item, 0) for item in data]

    def _decode(self, data, depth):
        if depth > self.max_depth:
            raise ValueError("value nested too deeply")
        kind = type(data)
        if data is None or kind is bool or kind is int or kind is str:
            return data
        if kind is list:  # the stateless form of a list (decode_value's callers)
            return [self._decode(item, depth + 1) for item in data]
        if kind is not dict or not data:
            raise ValueError(f"not an encoded value: {kind.__name__}")
        if len(data) == 1 and ("ref" in data or "handle" in data or "name" in data):
            return self._decode_reference(data)
        key = data.get("id")
        if "id" in data and (len(data) != 2 or not self.identity):
            raise ValueError("malformed id")
        tag = next(k for k in data if k != "id") if len(data) == 1 + ("id" in data) else None
        payload = data.get(tag)
        if tag in _MUTABLE_BY_TAG:
            return self._decode_mutable(tag, payload, key, depth)
        if tag not in _IMMUTABLE or "id" in data:
            raise ValueError(f"unknown tag {tag!r}")
        try:
            if tag == "int" and type(payload) is str:
                return int(payload, 16)
            if tag == "float" and type(payload) is str:
                return float(payload)
            if (
                tag == "complex"
                and type(payload) is list
                and len(payload) == 2
                and all(type(p) is str for p in payload)
            ):
                return complex(float(payload[0]), float(payload[1]))
            if tag == "bytes" and type(payload) is str:
                return bytes.fromhex(payload)
            if type(payload) is list:
                items = [self._decode(item, depth + 1) for item in payload]
                return tuple(items) if tag == "tuple" else frozenset(items)
        except (TypeError, OverflowError) as e:  # an unhashable frozenset member, a float out of range
            raise ValueError(str(e)) from e
        raise ValueError(f"malformed {tag} payload")

    def _decode_reference(self, data):
        ((tag, key),) = data.items()
        if tag == "ref":
            if not self.identity or type(key) is not int or key not in self.objects:
                raise ValueError("reference to an unknown object")
            return self.objects[key]
        if (
            self.resolve is None
            or (tag == "handle" and type(key) is not int)
            or (tag == "name" and type(key) is not str)
        ):
            raise ValueError(f"unexpected {tag}")
        return self.resolve(data)

    def _decode_mutable(self, tag, payload, key, depth):
        cls = _MUTABLE_BY_TAG[tag]
        if key is not None and type(key) is not int:
            raise ValueError("malformed id")
        if key is not None and key in self.objects:
            target = self.objects[key]
            if type(target) is not cls:
                raise ValueError(f"id {key} is not a {tag}")
        else:
            target = cls()
            if key is not None:
                self.objects[key] = target
                self.ids[id(target)] = key
        try:
            if tag == "bytearray":
                if type(payload) is not str:
                    raise ValueError("malformed bytearray")
                target[:] = bytes.fromhex(payload)
                return target
            if type(payload) is not list:
                raise ValueError(f"malformed {tag}")
            if tag in _PAIRS:
                pairs = [self._decode_pair(pair, depth) for pair in payload]
                target.clear()
                for k, v in pairs:
                    target[k] = v
                return target
            items = [self._decode(item, depth + 1) for item in payload]
            if tag == "list":
                target[:] = items
            else:
                target.clear()
                (target.update if tag == "set" else target.extend)(items)
            return target
        except (TypeError, OverflowError) as e:  # an unhashable key or member
            raise ValueError(str(e)) from e

    def _decode_pair(self, pair, depth):
        if type(pair) is not list or len(pair) != 2:
            raise ValueError("malformed pair")
        return self._decode(pair[0], depth + 1), self._decode(pair[1], depth + 1)


def encode_value(value, depth=0):
    """A JSON-ready form of a builtin value, without identity tracking; TypeError for anything else (exact
    types, or subclasses that keep their base's comparison)."""
    wire = Wire(identity=False, max_depth=_MAX_DEPTH - depth)
    return wire.encode([value])[0]


def decode_value(data, depth=0):
    """The builtin value :func:`encode_value` encoded; ValueError for anything not of that shape."""
    wire = Wire(identity=False, max_depth=_MAX_DEPTH - depth)
    return wire.decode([data])[0]
