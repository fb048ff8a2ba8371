"""Schema checks: what a client schema may use, and what any check may cost."""

import asyncio
import copy
import json
import threading
import time
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.chat.costs import python_calls_of
from tests.security.attacks import COSTLY_RESULTS
from tools.schemas import (
    CHECK_BUDGET_SECONDS,
    JSON_REWRITE_GROWTH_MAX,
    VALUE_MAX_BYTES,
    SchemaRefused,
    json_depth_exceeds,
    schema_check,
    schema_validator,
    text_within_bounds,
    validation_error,
    validation_problem,
    value_bounds_problem,
)


def _array_of(items: dict | None = None, **keywords) -> dict:
    array = {"type": "array", **keywords}
    if items is not None:
        array["items"] = items
    return {"type": "object", "properties": {"v": array}}


@pytest.mark.parametrize(
    ("schema", "refusal"),
    [
        (_array_of(uniqueItems=True), "uniqueItems is allowed only when items declares a scalar"),
        (_array_of({"type": "object"}, uniqueItems=True), "uniqueItems is allowed only"),
        (_array_of({"type": ["string", "array"]}, uniqueItems=True), "uniqueItems is allowed"),
        (
            {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
            "$ref is not allowed in a client tool's schema",
        ),
        ({"anyOf": [{"$dynamicRef": "#x"}]}, "$dynamicRef is not allowed"),
        ({"type": "object", "unevaluatedProperties": False}, "unevaluatedProperties is not"),
        (_array_of(unevaluatedItems=False), "unevaluatedItems is not allowed"),
        (
            {"properties": {"a": {"$schema": "http://json-schema.org/draft-07/schema#"}}},
            "$schema is allowed only at the root",
        ),
        ({"properties": {"a": {"pattern": "a+"}}}, "pattern and patternProperties"),
        ({"allOf": [{"type": "x"}]}, "not a valid JSON Schema"),
    ],
)
def test_a_client_schema_with_a_costly_keyword_is_refused(schema, refusal):
    with pytest.raises(SchemaRefused) as refused:
        schema_check(schema, what="result", client=True)
    assert refusal in str(refused.value)


@pytest.mark.parametrize(
    "schema",
    [
        _array_of({"type": "string"}, uniqueItems=True),
        _array_of({"type": ["integer", "null"]}, uniqueItems=True),
        _array_of({"enum": [1, 2, 3]}, uniqueItems=True),
        _array_of(uniqueItems=False),
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"},
    ],
)
def test_a_client_schema_without_costly_keywords_is_admitted(schema):
    schema_check(schema, what="result", client=True)


def test_a_schema_nested_deeper_than_32_levels_is_refused_whatever_its_depth():
    schema: dict = {"type": "object"}
    for _ in range(5000):
        schema = {"not": schema}
    with pytest.raises(SchemaRefused, match="nests deeper than 32 levels"):
        schema_check(schema, client=True)


@pytest.mark.parametrize(
    ("value", "unique"),
    [
        ([1, 2, 3], True),
        ([1, 1.0], False),
        ([1, True], True),
        ([0, False, None], True),
        ([{"a": 1, "b": 2}, {"b": 2, "a": 1}], False),
        ([[1, {"a": [2]}], [1, {"a": [2.0]}]], False),
        ([[1, 2], [2, 1]], True),
        (["a", "a"], False),
    ],
)
def test_unique_items_follows_json_equality(value, unique):
    schema = {"type": "array", "uniqueItems": True}
    assert (validation_error(schema=schema, value=value) is None) == unique


def test_a_value_too_deep_or_too_large_is_refused_without_being_checked():
    deep: list = []
    for _ in range(40):
        deep = [deep]
    assert "nests deeper than 32 levels" in validation_error(schema={}, value={"v": deep})
    large = {"v": "x" * 70_000}
    assert "larger than 64 KiB" in validation_error(schema={}, value=large)


TEXT_MAX_CHARS = VALUE_MAX_BYTES // JSON_REWRITE_GROWTH_MAX


@pytest.mark.parametrize(
    "text",
    [
        '{"v": "' + piece * ((TEXT_MAX_CHARS - 10) // len(piece)) + '"}'
        for piece in ["x", "é", "\U0001f600", "\\ud83d\\ude00", "\\u0001"]
    ]
    + ['{"v": [' + ",".join(["1e15"] * ((TEXT_MAX_CHARS - 10) // 5)) + "]}"],
    ids=["ascii", "accent", "astral", "surrogates", "control", "numbers"],
)
def test_a_short_text_with_few_brackets_holds_only_values_within_the_caps(text):
    """Whatever a short JSON text holds, written again it stays within the size cap, and it
    cannot nest deeper than its brackets: the text says so without walking the value."""
    assert text_within_bounds(text)
    value = json.loads(text)
    assert len(json.dumps(value, separators=(",", ":"))) <= VALUE_MAX_BYTES
    assert value_bounds_problem(value) is None


def test_measuring_a_value_costs_a_python_call_per_object_or_array():
    """Every client tool's arguments are measured against the caps on the event loop before
    their check (issue 15): JSON's own types are known without the `Mapping` ABC (a Python
    call for each node), children are stacked in C, and one encoder, made once, writes the
    value out. Was 27 calls for this value."""
    value = {"a": [1, {"b": 2.5}], "c": "x", "d": None, "e": True}
    value_bounds_problem(value)
    # value_bounds_problem, json_depth_exceeds, a tick for each of the 3 containers, and the
    # encoder's encode and iterencode
    assert python_calls_of(value_bounds_problem, value) <= 7


def test_a_mapping_of_another_type_is_measured_as_an_object():
    deep: list = []
    for _ in range(40):
        deep = [deep]
    assert json_depth_exceeds(types.MappingProxyType({"v": deep}), 32)
    assert not json_depth_exceeds(types.MappingProxyType({"v": [[1]]}), 32)


def test_a_text_is_not_taken_for_bounded_when_long_or_bracketed():
    deep = "[" * 33 + "]" * 33
    assert not text_within_bounds(deep)
    assert value_bounds_problem(json.loads(deep)) == "the value nests deeper than 32 levels"
    assert not text_within_bounds(json.dumps({"v": "x" * 6000}))
    assert text_within_bounds("[" * 32 + "]" * 32)


@pytest.mark.parametrize("costly", COSTLY_RESULTS, ids=lambda c: c.name)
def test_the_costliest_answers_are_decided_within_the_budget(costly):
    # The budget is CPU time (a busy machine stretches the wall clock, not the work). The
    # deadline is read between keywords, so a check overruns it by at most one keyword's work,
    # and on a loaded machine a CPU second does less (shared caches): twice the budget is the
    # bound that says "stopped", an unbounded check takes seconds to minutes here.
    started = time.thread_time()
    validation_error(schema=costly.schema, value=costly.value)
    assert time.thread_time() - started < 2 * CHECK_BUDGET_SECONDS


def test_a_check_that_runs_out_of_time_refuses_with_a_sentence():
    costly = COSTLY_RESULTS[-1]  # the wide anyOf matched by its last branch
    problem = validation_error(schema=costly.schema, value=costly.value)
    assert problem == "(root): the value could not be checked within 0.25 s and is refused"


@pytest.mark.asyncio
async def test_validation_runs_off_the_event_loop_which_keeps_running():
    costly = COSTLY_RESULTS[-1]
    beats = 0

    async def heartbeat():
        nonlocal beats
        while True:
            await asyncio.sleep(0.005)
            beats += 1

    beating = asyncio.create_task(heartbeat())
    problem = await validation_problem(schema=costly.schema, value=costly.value)
    beating.cancel()
    assert "could not be checked" in problem
    # 0.25 s of checking; a blocked loop would have beaten at most once. How often it beats
    # meanwhile depends on how the checking thread and the loop share the GIL (7 in one CI
    # run, where 10 was asked): a few beats are the proof the loop kept running.
    assert beats >= 3


def test_one_compiled_validator_serves_every_copy_of_a_schema():
    schema = _array_of({"type": "string"}, uniqueItems=True)
    assert schema_validator(schema) is schema_validator(copy.deepcopy(schema))


def test_checks_run_in_the_schema_worker_threads():
    seen: list[str] = []

    async def check():
        from tools.schemas import checked_off_loop

        await checked_off_loop(lambda: seen.append(threading.current_thread().name))

    asyncio.run(check())
    assert seen[0].startswith("schema-check")


SMALL_SCHEMA = {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]}


@pytest.fixture
def offloaded(monkeypatch) -> list[str]:
    """The checks that went to the schema threads. The inline budget is wall time, which a
    loaded machine can spend with the test's thread off its core mid-check (such a check goes
    to the threads, as it should): these tests say where a check runs, not how long it may
    take there, so theirs is a second (seen failing at a load average of 9)."""
    import tools.schemas as schemas

    monkeypatch.setattr(schemas, "INLINE_BUDGET_SECONDS", 1.0)
    seen: list[str] = []
    real = schemas.checked_off_loop

    async def counted(fn, /, *args, **kwargs):
        seen.append(fn.__name__)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(schemas, "checked_off_loop", counted)
    return seen


@pytest.mark.asyncio
async def test_a_small_answer_is_checked_on_the_loop_without_a_thread_hop(offloaded):
    from tools.schemas import validation_problem

    assert await validation_problem(schema=SMALL_SCHEMA, value={"i": 1}, size=8) is None
    assert "'x' is not of type 'integer'" in await validation_problem(
        schema=SMALL_SCHEMA, value={"i": "x"}, size=10
    )
    assert offloaded == []
    # Without a size, or a large one, the check goes to the threads as before.
    await validation_problem(schema=SMALL_SCHEMA, value={"i": 1})
    await validation_problem(schema=SMALL_SCHEMA, value={"i": 1}, size=64 * 1024)
    assert offloaded == ["validation_error", "validation_error"]


@pytest.mark.asyncio
async def test_a_small_answer_is_checked_on_the_loop_without_reading_the_threads_cpu_clock(
    offloaded, monkeypatch
):
    """The thread's CPU time is a system call (about a microsecond here) and was read before
    every keyword: more than the whole check of a small answer. Inline, the deadline is read
    from the wall clock; a check it cuts short is checked again in the threads."""
    from tools.schemas import validation_problem

    reads, here = [], threading.get_ident()
    real = time.thread_time
    monkeypatch.setattr(
        time, "thread_time", lambda: (threading.get_ident() == here and reads.append(1)) or real()
    )
    assert await validation_problem(schema=SMALL_SCHEMA, value={"i": 1}, size=8) is None
    assert offloaded == []
    assert reads == []


@pytest.mark.asyncio
async def test_a_small_answer_too_costly_for_the_loop_is_checked_again_in_the_threads(
    offloaded, monkeypatch
):
    import tools.schemas as schemas

    monkeypatch.setattr(schemas, "INLINE_BUDGET_SECONDS", 0.0)
    assert "'x' is not of type 'integer'" in await schemas.validation_problem(
        schema=SMALL_SCHEMA, value={"i": "x"}, size=10
    )
    assert offloaded == ["validation_error"]


# --- the quick check of the common keywords ---------------------------------------------------


def test_a_value_of_a_common_shape_is_decided_without_jsonschema(monkeypatch):
    """jsonschema spent ~15 µs on `{"i": 1}` against SMALL_SCHEMA, half of a client tool's
    round trip on the loop (issue 15, item 8): a valid value of a schema that keeps to the
    common keywords is decided by the quick check; only an invalid one gets jsonschema's
    sentence."""
    import tools.schemas as schemas

    walked = []
    real = schemas.BoundedValidator.iter_errors
    monkeypatch.setattr(
        schemas.BoundedValidator,
        "iter_errors",
        lambda self, value, *a, **kw: walked.append(value) or real(self, value, *a, **kw),
    )
    assert validation_error(schema=SMALL_SCHEMA, value={"i": 1}) is None
    assert walked == []
    assert "'x' is not of type 'integer'" in validation_error(schema=SMALL_SCHEMA, value={"i": "x"})
    assert walked == [{"i": "x"}]


def test_the_quick_check_of_a_small_value_makes_one_call_per_keyword_and_node():
    """No generator per object or array (`all(...)` over one cost more than the check): for
    `{"i": 1}`, the root's and the property's checks, their deadline ticks, and one call per
    keyword."""
    import sys

    quick = schema_validator(SMALL_SCHEMA).quick
    calls = []
    sys.setprofile(lambda frame, event, arg: event == "call" and calls.append(frame.f_code))
    try:
        assert quick({"i": 1})
    finally:
        sys.setprofile(None)
    # valid() and _tick() twice each; type, properties and required at the root; type below
    assert len(calls) <= 8, [code.co_name for code in calls]


def test_a_schema_with_another_keyword_is_left_to_jsonschema():
    """Keywords outside the quick check's list (here `pattern`, `if`, `prefixItems`,
    `multipleOf`, `$ref`) leave the whole schema to jsonschema, nested or not."""
    for schema in (
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}},
        {"if": {"type": "string"}, "then": {"minLength": 2}},
        {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}},
        {"anyOf": [{"multipleOf": 3}, {"type": "string"}]},
        {"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a"},
        {"type": "unknown-type"},
    ):
        assert schema_validator(schema).quick is None, schema


_KEYS = ("a", "b", "c")
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from([0.0, 1.0, -1.5, 2.5, 1e20])
    | st.text("ab", max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), inner),
    max_leaves=8,
)
_TYPES = ("object", "array", "string", "boolean", "null", "number", "integer")


def _schemas() -> st.SearchStrategy:
    def keywords(inner: st.SearchStrategy) -> st.SearchStrategy:
        number = st.sampled_from([-1, 0, 1, 1.5, 2])
        count = st.integers(0, 3)
        return st.fixed_dictionaries(
            {},
            optional={
                "type": st.sampled_from(_TYPES)
                | st.lists(st.sampled_from(_TYPES), min_size=1, max_size=3),
                "properties": st.dictionaries(st.sampled_from(_KEYS), inner, max_size=3),
                "required": st.lists(st.sampled_from(_KEYS), max_size=3, unique=True),
                "additionalProperties": st.booleans() | inner,
                "items": inner,
                "enum": st.lists(_JSON, min_size=1, max_size=3),
                "const": _JSON,
                "minimum": number,
                "maximum": number,
                "exclusiveMinimum": number,
                "exclusiveMaximum": number,
                "minLength": count,
                "maxLength": count,
                "minItems": count,
                "maxItems": count,
                "minProperties": count,
                "maxProperties": count,
                "uniqueItems": st.booleans(),
                "allOf": st.lists(inner, min_size=1, max_size=3),
                "anyOf": st.lists(inner, min_size=1, max_size=3),
                "oneOf": st.lists(inner, min_size=1, max_size=3),
                "not": inner,
                "description": st.just("annotation only"),
                "format": st.just("email"),
            },
        )

    return st.recursive(st.booleans() | keywords(st.booleans()), keywords, max_leaves=6)


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=_schemas(), value=_JSON)
def test_the_quick_check_agrees_with_jsonschema(schema, value):
    compiled = schema_validator(schema)
    assert compiled.quick is not None
    assert compiled.quick(value) == compiled.validator.is_valid(value)
