"""Schema checks: what a client schema may use, and what any check may cost."""

import asyncio
import copy
import json
import threading
import time

import pytest

from tests.security.attacks import COSTLY_RESULTS
from tools.schemas import (
    CHECK_BUDGET_SECONDS,
    JSON_REWRITE_GROWTH_MAX,
    VALUE_MAX_BYTES,
    SchemaRefused,
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
    """The checks that went to the schema threads."""
    import tools.schemas as schemas

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
