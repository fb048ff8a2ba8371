"""JSON Schema checks shared by backend tools, client tools and their results.

A browser declares the schemas of its client tools and answers against them, so a hostile
page picks a schema that is slow to check and a value that is slow against it. The cost of
every check here is bounded, and none runs on the event loop:

- Admission (`schema_check(..., client=True)`): a client schema may not use the keywords
  whose cost is not linear in the value (`pattern`/`patternProperties`, `uniqueItems` over
  items that are not declared scalar, `$ref`/`$dynamicRef` (reference cycles, retrieval),
  `unevaluatedItems`/`unevaluatedProperties` (they re-validate subschemas), `$schema` below
  the root (it would switch to a validator without these bounds)), nor nest deeper than
  `SCHEMA_MAX_DEPTH`.
- Caps before validating: a value larger than `VALUE_MAX_BYTES` or deeper than
  `VALUE_MAX_DEPTH` is refused without being validated.
- A deadline in CPU time: every keyword of a validation first checks the thread's deadline
  (exceeding it raises `CheckTooCostly`), and hands the GIL over every half millisecond, so a
  long check never holds the event loop's thread off for more than a moment. (A small value
  is first checked on the loop within 2 ms of wall time: `checked_inline`.)
- Off the loop: `checked_off_loop` runs a check in a small thread pool of its own (never the
  thread that runs sync ORM code) with that deadline; `validation_problem` is the async
  validation every caller uses.
- `uniqueItems` is checked in linear time (hashing a canonical form), not pair by pair.
- One compiled validator per distinct schema, cached.
"""

import asyncio
import functools
import itertools
import json
import numbers
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema_specifications import REGISTRY
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

FORBIDDEN_SCHEMA_KEYS = frozenset({"pattern", "patternProperties"})
# Keywords a client schema may not use at all: their cost is not bounded by the value's size.
COSTLY_CLIENT_KEYS = frozenset(
    {"$ref", "$dynamicRef", "$recursiveRef", "unevaluatedItems", "unevaluatedProperties"}
)
SCALAR_TYPES = frozenset({"string", "number", "integer", "boolean", "null"})

SCHEMA_MAX_DEPTH = 32  # JSON nesting of a declared schema (about 15 levels of subschemas)
VALUE_MAX_DEPTH = 32
VALUE_MAX_BYTES = 64 * 1024
CHECK_BUDGET_SECONDS = 0.25
# A value whose JSON text is at most this long is checked on the event loop, within
# INLINE_BUDGET_SECONDS of CPU (a hop to the schema threads costs more than such a check);
# one that needs longer is checked again in the threads with the full budget.
INLINE_MAX_CHARS = 4 * 1024
INLINE_BUDGET_SECONDS = 0.002
YIELD_SECONDS = 0.0005  # CPU time between two GIL hand-overs to the event loop's thread

T = TypeVar("T")


class SchemaRefused(ValueError):
    """A declared schema is not acceptable; the message says why, for the declarer."""


class CheckTooCostly(Exception):
    """A check ran past its time budget and was abandoned."""


# --- the deadline ----------------------------------------------------------------------------

_local = threading.local()


def _tick() -> None:
    """Called before every keyword (and node walked): enforce the deadline, and hand the GIL
    to the event loop's thread every `YIELD_SECONDS`, which otherwise waits for it up to the
    interpreter's 5 ms switch interval each time it wakes."""
    deadline = getattr(_local, "deadline", None)
    if deadline is None:
        return
    now = _local.clock()
    if now - _local.yielded > YIELD_SECONDS:
        time.sleep(0)
        _local.yielded = now
    if now > deadline:
        raise CheckTooCostly


def _with_deadline(
    budget: float,
    fn: Callable[..., T],
    /,
    *args: Any,
    clock: Callable[[], float] = time.thread_time,
    **kwargs: Any,
) -> T:
    """Run `fn` with a deadline `budget` seconds away on `clock` (a deadline already set
    stays). By default the CPU time of this thread: the budget measures the check's own work,
    not how busy the machine is or how long the thread waited for the GIL."""
    outer = getattr(_local, "deadline", None)
    if outer is None:
        _local.clock = clock
        _local.started = clock()
        _local.deadline = _local.started + budget
        _local.yielded = _local.started
    try:
        return fn(*args, **kwargs)
    finally:
        _local.deadline = outer


_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="schema-check")


async def checked_off_loop(
    fn: Callable[..., T], /, *args: Any, budget: float = CHECK_BUDGET_SECONDS, **kwargs: Any
) -> T:
    """Run a check in the schema worker threads with a deadline of `budget` seconds.

    Raises `CheckTooCostly` when the deadline passes; a cancelled caller leaves the check to
    end at its deadline at the latest.
    """
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        _pool, functools.partial(_with_deadline, budget, fn, *args, **kwargs)
    )


# --- a validator whose every keyword is bounded ----------------------------------------------


def _budgeted(keyword: Callable) -> Callable:
    @functools.wraps(keyword)
    def check(validator, value, instance, schema):
        _tick()
        return keyword(validator, value, instance, schema)

    return check


def _canonical(value: Any) -> Any:
    """A hashable form with JSON equality: 1 == 1.0, true != 1, objects ignore key order."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    _tick()
    if isinstance(value, list):
        return ("array", tuple(_canonical(item) for item in value))
    if isinstance(value, dict):
        return ("object", frozenset((key, _canonical(item)) for key, item in value.items()))
    return ("other", repr(value))


def _unique_items(validator, unique, instance, schema):
    _tick()
    if unique and validator.is_type(instance, "array"):
        keys = [_canonical(item) for item in instance]
        if len(set(keys)) != len(keys):
            yield ValidationError("has non-unique elements")


BoundedValidator = validators.extend(
    Draft202012Validator,
    {
        **{name: _budgeted(fn) for name, fn in Draft202012Validator.VALIDATORS.items()},
        "uniqueItems": _unique_items,
    },
)


# --- the quick check of the common keywords --------------------------------------------------
# jsonschema spends ~15 µs on `{"i": 5}` against a three-keyword schema (a validator evolved
# per subschema, a generator per keyword): half of a client tool's round trip on the event
# loop besides Daphne's own work (issue 15, item 8). A schema that uses only the keywords
# below is also compiled to nested closures that answer "valid or not" with jsonschema's
# semantics for them (draft 2020-12, no format assertion); only a value they find invalid is
# checked again by jsonschema, for its sentence. Any other keyword leaves the schema to
# jsonschema alone. Each closure ticks the deadline once per (subschema, value) it checks, so
# a value's cost stays bounded as above; `tests/tools/test_schemas.py` compares both verdicts
# on generated schemas and values.

Quick = Callable[[Any], bool]

# Keywords that never decide validity here (jsonschema asserts no `format` without a checker).
_ANNOTATION_KEYS = frozenset(
    {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
     "writeOnly", "format"}
)  # fmt: skip


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Number)


_TYPE_TESTS: dict[str, Quick] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": _is_number,
    "integer": lambda v: (
        not isinstance(v, bool)
        and (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))
    ),
}


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _quick_type(arg: Any, schema: dict) -> Quick | None:
    names = arg if isinstance(arg, list) else [arg]
    if not names or not all(isinstance(n, str) and n in _TYPE_TESTS for n in names):
        return None
    tests = tuple(_TYPE_TESTS[n] for n in names)
    if len(tests) == 1:
        return tests[0]
    return lambda v: any(test(v) for test in tests)


def _quick_properties(arg: Any, schema: dict) -> Quick | None:
    if not isinstance(arg, dict):
        return None
    subs = tuple((name, _quick(sub)) for name, sub in arg.items())
    if any(sub is None for _, sub in subs):
        return None

    # Loops, not all(...) over a generator: a generator per value costs more than the check.
    def check(v: Any) -> bool:
        if isinstance(v, dict):
            for name, sub in subs:
                if name in v and not sub(v[name]):
                    return False
        return True

    return check


def _quick_required(arg: Any, schema: dict) -> Quick | None:
    if not isinstance(arg, list) or not all(isinstance(n, str) for n in arg):
        return None
    names = frozenset(arg)
    return lambda v: not isinstance(v, dict) or names.issubset(v.keys())


def _quick_additional(arg: Any, schema: dict) -> Quick | None:
    known = schema.get("properties", {})
    if not isinstance(known, dict) or "patternProperties" in schema:
        return None
    if arg is True:
        return lambda v: True
    names = frozenset(known)
    if arg is False:
        return lambda v: not isinstance(v, dict) or names.issuperset(v.keys())
    sub = _quick(arg) if isinstance(arg, dict) else None
    if sub is None:
        return None

    def check(v: Any) -> bool:
        if isinstance(v, dict):
            for key, item in v.items():
                if key not in names and not sub(item):
                    return False
        return True

    return check


def _quick_items(arg: Any, schema: dict) -> Quick | None:
    sub = _quick(arg) if "prefixItems" not in schema else None
    if sub is None:
        return None

    def check(v: Any) -> bool:
        if isinstance(v, list):
            for item in v:
                if not sub(item):
                    return False
        return True

    return check


def _quick_enum(arg: Any, schema: dict) -> Quick | None:
    if not isinstance(arg, list):
        return None
    allowed = frozenset(_canonical(item) for item in arg)
    return lambda v: _canonical(v) in allowed


def _quick_const(arg: Any, schema: dict) -> Quick | None:
    expected = _canonical(arg)
    return lambda v: _canonical(v) == expected


def _quick_bound(compare: Callable[[Any, Any], bool]) -> Callable[[Any, dict], Quick | None]:
    """minimum and its kin: `compare(value, limit)` is jsonschema's failing test."""

    def make(arg: Any, schema: dict) -> Quick | None:
        if not _is_number(arg):
            return None
        return lambda v: not _is_number(v) or not compare(v, arg)

    return make


def _quick_length(kind: type, at_least: bool) -> Callable[[Any, dict], Quick | None]:
    """minLength, maxItems and their kin: the length of a `kind` value against a count."""

    def make(arg: Any, schema: dict) -> Quick | None:
        if not _is_count(arg):
            return None
        if at_least:
            return lambda v: not isinstance(v, kind) or len(v) >= arg
        return lambda v: not isinstance(v, kind) or len(v) <= arg

    return make


def _quick_unique(arg: Any, schema: dict) -> Quick | None:
    if not isinstance(arg, bool):
        return None
    if not arg:
        return lambda v: True
    return lambda v: not isinstance(v, list) or len({_canonical(item) for item in v}) == len(v)


def _quick_branches(combine: Callable[[list[bool]], bool]) -> Callable[[Any, dict], Quick | None]:
    """allOf, anyOf, oneOf: `combine` reads every branch's verdict."""

    def make(arg: Any, schema: dict) -> Quick | None:
        if not isinstance(arg, list) or not arg:
            return None
        subs = tuple(_quick(sub) for sub in arg)
        if any(sub is None for sub in subs):
            return None
        return lambda v: combine([sub(v) for sub in subs])

    return make


def _quick_not(arg: Any, schema: dict) -> Quick | None:
    sub = _quick(arg)
    return None if sub is None else (lambda v: not sub(v))


_QUICK_KEYWORDS: dict[str, Callable[[Any, dict], Quick | None]] = {
    "type": _quick_type,
    "properties": _quick_properties,
    "required": _quick_required,
    "additionalProperties": _quick_additional,
    "items": _quick_items,
    "enum": _quick_enum,
    "const": _quick_const,
    "minimum": _quick_bound(lambda v, limit: v < limit),
    "maximum": _quick_bound(lambda v, limit: v > limit),
    "exclusiveMinimum": _quick_bound(lambda v, limit: v <= limit),
    "exclusiveMaximum": _quick_bound(lambda v, limit: v >= limit),
    "minLength": _quick_length(str, at_least=True),
    "maxLength": _quick_length(str, at_least=False),
    "minItems": _quick_length(list, at_least=True),
    "maxItems": _quick_length(list, at_least=False),
    "minProperties": _quick_length(dict, at_least=True),
    "maxProperties": _quick_length(dict, at_least=False),
    "uniqueItems": _quick_unique,
    "allOf": _quick_branches(all),
    "anyOf": _quick_branches(any),
    "oneOf": _quick_branches(lambda verdicts: verdicts.count(True) == 1),
    "not": _quick_not,
}


def _quick(schema: Any) -> Quick | None:
    """The quick check of `schema`, or None when it uses a keyword not above."""
    if schema is True or schema is False:
        return lambda v: schema
    if not isinstance(schema, dict):
        return None
    checks = []
    for key, arg in schema.items():
        if key in _ANNOTATION_KEYS:
            continue
        make = _QUICK_KEYWORDS.get(key)
        check = make(arg, schema) if make is not None else None
        if check is None:
            return None
        checks.append(check)
    checks_run = tuple(checks)

    def valid(value: Any) -> bool:
        _tick()
        for check in checks_run:
            if not check(value):
                return False
        return True

    return valid


@dataclass(frozen=True)
class CompiledSchema:
    """A schema's `BoundedValidator` and, when it keeps to the common keywords, its quick
    check (above)."""

    validator: Any
    quick: Quick | None


@functools.lru_cache(maxsize=512)
def _compiled(canonical_schema: str) -> CompiledSchema:
    schema = json.loads(canonical_schema)
    return CompiledSchema(validator=BoundedValidator(schema), quick=_quick(schema))


def schema_validator(schema: Mapping[str, Any]) -> CompiledSchema:
    """The compiled validator of `schema`, one per distinct schema (cached by its text)."""
    return _compiled(json.dumps(schema, sort_keys=True, separators=(",", ":")))


# --- admission of declared schemas -----------------------------------------------------------


_JSON_LEAVES = (str, int, float, type(None))  # bool is an int


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether `value` nests deeper than `limit` (iterative: any depth is safe to ask about).

    A node's children are stacked by C (`zip` with `repeat`), and JSON's own types are known
    without asking the `Mapping` ABC (a Python call for each node): a value's walk costs a
    tick per object or array."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, list):
            children = node
        elif node.__class__ is dict or (
            not isinstance(node, _JSON_LEAVES) and isinstance(node, Mapping)
        ):
            children = node.values()
        else:
            continue
        if depth > limit:
            return True
        _tick()
        stack.extend(zip(children, itertools.repeat(depth + 1)))
    return False


def _declares_scalars(items: Any) -> bool:
    if not isinstance(items, Mapping):
        return False
    if "enum" in items or "const" in items:
        return True
    kind = items.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    return bool(kinds) and all(k in SCALAR_TYPES for k in kinds)


def _refused_key_path(node: Any, *, client: bool, path: str = "") -> tuple[str, str] | None:
    """The first (path, reason) of a keyword the schema may not use, or None."""
    _tick()
    if isinstance(node, Mapping):
        if client and path and "$schema" in node:
            # jsonschema would check that subschema with a validator of its own choosing.
            return f"{path}/$schema", "$schema is allowed only at the root"
        if client and node.get("uniqueItems") is True and not _declares_scalars(node.get("items")):
            return (
                f"{path}/uniqueItems",
                "uniqueItems is allowed only when items declares a scalar type",
            )
        for key, value in node.items():
            here = f"{path}/{key}"
            if key in FORBIDDEN_SCHEMA_KEYS:
                return here, "pattern and patternProperties are not allowed"
            if client and key in COSTLY_CLIENT_KEYS:
                return here, f"{key} is not allowed in a client tool's schema"
            found = _refused_key_path(value, client=client, path=here)
            if found:
                return found
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found = _refused_key_path(value, client=client, path=f"{path}/{index}")
            if found:
                return found
    return None


def _meta_validator() -> Any:
    """The 2020-12 meta-schema, checked by `BoundedValidator` all the way down.

    jsonschema picks a subschema's validator class by its `$schema`, and every vocabulary of
    the meta-schema names one: left as they are, the check of a declared schema would leave
    the deadline and its GIL hand-overs behind at the first `$ref`. Without `$schema`, every
    resource is read as 2020-12 by the registry and checked by this module's class.
    """
    resources = []
    for uri in REGISTRY:
        if "/draft/2020-12/" not in uri:
            continue
        contents = {k: v for k, v in REGISTRY.contents(uri).items() if k != "$schema"}
        resources.append((uri, Resource(contents=contents, specification=DRAFT202012)))
    meta_uri = Draft202012Validator.META_SCHEMA["$id"]
    registry = Registry().with_resources(resources)
    return BoundedValidator(registry.contents(meta_uri), registry=registry)


_meta = _meta_validator()


def schema_check(schema: Any, *, what: str = "schema", client: bool = False) -> None:
    """Refuse a schema that is not a valid JSON Schema object or uses `pattern` anywhere.

    `pattern`/`patternProperties` are refused at any depth (client-tools reference): regular
    expression dialects differ between validators, so a check must live in the handler. A
    client's schema (`client=True`) is held to the cost rules of this module's docstring.
    Verdicts are cached by the schema's canonical text: a page registers the same tools again
    after every reconnect.
    """
    if not isinstance(schema, Mapping):
        raise SchemaRefused(f"{what} must be a JSON Schema object")
    if json_depth_exceeds(schema, SCHEMA_MAX_DEPTH):
        raise SchemaRefused(f"{what} nests deeper than {SCHEMA_MAX_DEPTH} levels")
    refusal = _schema_refusal(json.dumps(schema, sort_keys=True, separators=(",", ":")), client)
    if refusal:
        raise SchemaRefused(f"{what} {refusal}")


@functools.lru_cache(maxsize=512)
def _schema_refusal(canonical_schema: str, client: bool) -> str | None:
    schema = json.loads(canonical_schema)
    found = _refused_key_path(schema, client=client)
    if found:
        where, reason = found
        return f"uses {where.rsplit('/', 1)[-1]!r} at {where}; {reason}"
    error = next(iter(_meta.iter_errors(schema)), None)
    if error is not None:
        return f"is not a valid JSON Schema: {_short(error.message)}"
    return None


# --- validating values -----------------------------------------------------------------------


def validation_error(
    *, schema: Mapping[str, Any], value: Any, bounded: bool = False, validator: Any = None
) -> str | None:
    """A readable sentence naming the first problems of `value`, or None when it is valid.

    Bounded: the caps come first (unless the caller already refused a value past them,
    `bounded`), then the caller's deadline (`checked_off_loop`) or, on a thread without one,
    `CHECK_BUDGET_SECONDS`; a check that runs out of time refuses. `validator`: the
    caller's `schema_validator(schema)`, kept to skip looking it up by the schema's text.
    """
    if getattr(_local, "deadline", None) is None:
        return _with_deadline(
            CHECK_BUDGET_SECONDS,
            validation_error,
            schema=schema,
            value=value,
            bounded=bounded,
            validator=validator,
        )
    try:
        return _problems(
            validator if validator is not None else schema_validator(schema),
            value=value,
            bounded=bounded,
        )
    except CheckTooCostly:
        _local.inline_too_costly = True  # checked_inline tries again in the threads
        budget = _local.deadline - _local.started
        return f"(root): the value could not be checked within {budget:.2g} s and is refused"


# Written again as JSON, a value read from N characters of JSON text takes at most 12 N: an
# astral character (one `str` character) becomes a surrogate pair of escapes, `\ud83d\ude00`.
JSON_REWRITE_GROWTH_MAX = 12


def text_within_bounds(text: str) -> bool:
    """Whether every value read from this JSON text is within the caps, by the text alone
    (then `value_bounds_problem` need not walk it nor write it out again): nesting deeper
    than `VALUE_MAX_DEPTH` takes more opening brackets than that (brackets inside strings only
    count against the text), and a short text cannot grow past `VALUE_MAX_BYTES`."""
    return (
        len(text) * JSON_REWRITE_GROWTH_MAX <= VALUE_MAX_BYTES
        and text.count("{") + text.count("[") <= VALUE_MAX_DEPTH
    )


def size_within_bounds(size: int) -> bool:
    """Whether every value read from a JSON text of `size` characters is within the caps by
    its length alone: each level of nesting takes two brackets, so nesting deeper than
    `VALUE_MAX_DEPTH` takes more characters than this, and so short a text cannot grow past
    `VALUE_MAX_BYTES` (`text_within_bounds`). A model's arguments (`{"i": 1}`, `{}`) are this
    short nearly always: then they are not walked nor written out again to be measured."""
    return size <= 2 * VALUE_MAX_DEPTH + 1


# `json.dumps(value, separators=(",", ":"))` without making an encoder for every value.
_compact_json = json.JSONEncoder(separators=(",", ":")).encode


def value_bounds_problem(value: Any) -> str | None:
    """Why `value` is too deep or too large to check at all, or None."""
    if json_depth_exceeds(value, VALUE_MAX_DEPTH):
        return f"the value nests deeper than {VALUE_MAX_DEPTH} levels"
    if len(_compact_json(value)) > VALUE_MAX_BYTES:
        return f"the value is larger than {VALUE_MAX_BYTES // 1024} KiB"
    return None


def _problems(compiled: CompiledSchema, *, value: Any, bounded: bool) -> str | None:
    too_big = None if bounded else value_bounds_problem(value)
    if too_big:
        return f"(root): {too_big}"
    if compiled.quick is not None and compiled.quick(value):
        return None
    errors = []
    for error in compiled.validator.iter_errors(value):
        errors.append(error)
        if len(errors) == 3:
            break
    if not errors:
        return None
    errors.sort(key=lambda e: [str(p) for p in e.absolute_path])
    parts = []
    for error in errors:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        parts.append(f"{where}: {_short(error.message)}")
    return "; ".join(parts)


def _short(message: str, limit: int = 200) -> str:
    return message if len(message) <= limit else message[: limit - 1] + "…"


async def validation_problem(
    *,
    schema: Mapping[str, Any],
    value: Any,
    budget: float = CHECK_BUDGET_SECONDS,
    size: int | None = None,
    bounded: bool = False,
    validator: Any = None,
) -> str | None:
    """`validation_error` off the event loop, within `budget` seconds: the one way callers
    validate a value that the model or a browser sent. `size`, the length of the JSON text
    the value came in, when known: a small value is checked here first (`checked_inline`).
    `bounded` and `validator` as for `validation_error`."""
    return await checked_inline(
        validation_error,
        size=size,
        budget=budget,
        schema=schema,
        value=value,
        bounded=bounded,
        validator=validator,
    )


async def checked_inline(
    fn: Callable[..., T],
    /,
    *args: Any,
    size: int | None,
    budget: float = CHECK_BUDGET_SECONDS,
    **kwargs: Any,
) -> T:
    """`checked_off_loop`, except that a value of at most `INLINE_MAX_CHARS` of JSON is
    checked on the loop within `INLINE_BUDGET_SECONDS`; past that, in the threads.

    The inline deadline is wall time (`time.perf_counter`, read without a system call), not
    the thread's CPU time (a system call, about a microsecond each here, read before every
    keyword): a check of a small value costs less than those reads did. A check that a busy
    machine delays past the deadline is only checked again in the threads, on CPU time, so no
    verdict depends on the machine's load."""
    if size is not None and size <= INLINE_MAX_CHARS:
        _local.inline_too_costly = False
        try:
            result = _with_deadline(
                INLINE_BUDGET_SECONDS, fn, *args, clock=time.perf_counter, **kwargs
            )
        except CheckTooCostly:
            pass
        else:
            if not _local.inline_too_costly:
                return result
    return await checked_off_loop(fn, *args, budget=budget, **kwargs)


def arguments_decode(raw: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """The model's arguments as an object; raises ValueError with a readable reason."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"the arguments are not valid JSON ({exc.msg} at position {exc.pos})"
        ) from None
    except RecursionError:
        raise ValueError("the arguments nest too deeply") from None
    if not isinstance(value, dict):
        raise ValueError("the arguments must be a JSON object")
    return value
