"""Check a decoded JSON value against a shape of `geosense.wire` (a TypedDict), for tests.

The test suites run every SSE event they read and every socket frame they receive through
`shape_problem`, so a payload that drifts from its declared shape fails a test.
"""

import types
import typing
from typing import Any, Literal, NotRequired, Required, Union

from geosense import wire


def _is_typeddict(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, dict) and hasattr(kind, "__required_keys__")


def shape_problem(value: Any, kind: Any, where: str = "$") -> str | None:
    """Where and why `value` does not have the shape `kind`, or None when it does."""
    origin = typing.get_origin(kind)
    if kind is Any:
        return None
    if kind is None or kind is type(None):
        return None if value is None else f"{where}: expected null, got {value!r}"
    if origin in (Required, NotRequired):
        return shape_problem(value, typing.get_args(kind)[0], where)
    if origin is Literal:
        allowed = typing.get_args(kind)
        return None if value in allowed else f"{where}: {value!r} is not one of {allowed}"
    if origin in (Union, types.UnionType):
        problems = [shape_problem(value, option, where) for option in typing.get_args(kind)]
        return None if None in problems else " or ".join(p for p in problems if p)
    if _is_typeddict(kind):
        return _typeddict_problem(value, kind, where)
    if origin is list or kind is list:
        if not isinstance(value, list):
            return f"{where}: expected a list, got {type(value).__name__}"
        (item,) = typing.get_args(kind) or (Any,)
        for index, element in enumerate(value):
            problem = shape_problem(element, item, f"{where}[{index}]")
            if problem:
                return problem
        return None
    if origin is dict or kind is dict:
        return None if isinstance(value, dict) else f"{where}: expected an object"
    if kind is bool:
        return None if isinstance(value, bool) else f"{where}: expected a boolean, got {value!r}"
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"{where}: expected an integer, got {value!r}"
    if kind is str:
        return None if isinstance(value, str) else f"{where}: expected a string, got {value!r}"
    raise TypeError(f"shape_problem does not know {kind!r}")


def _typeddict_problem(value: Any, kind: type, where: str) -> str | None:
    if not isinstance(value, dict):
        return f"{where}: expected an object ({kind.__name__}), got {type(value).__name__}"
    hints = typing.get_type_hints(kind, include_extras=True)
    missing = sorted(kind.__required_keys__ - set(value))
    if missing:
        return f"{where}: {kind.__name__} lacks {', '.join(missing)}"
    extra = sorted(set(value) - set(hints))
    if extra:
        return f"{where}: {kind.__name__} has unknown {', '.join(extra)}"
    for key, element in value.items():
        problem = shape_problem(element, hints[key], f"{where}.{key}")
        if problem:
            return problem
    return None


def event_problem(name: str, data: Any) -> str | None:
    """A turn event's problem: an unknown name, or data not of its shape."""
    if name not in wire.EVENT_DATA:
        return f"unknown event {name!r}"
    return shape_problem(data, wire.EVENT_DATA[name], name)


def server_frame_problem(frame: Any) -> str | None:
    """A frame from the server: a known type, the shape of that type, and a valid event."""
    kind = wire.SERVER_FRAMES.get(frame.get("type")) if isinstance(frame, dict) else None
    if kind is None:
        return f"unknown frame {frame!r}"
    problem = shape_problem(frame, kind)
    if problem is None and frame["type"] == "event":
        problem = event_problem(frame["event"], frame["data"])
    return problem
