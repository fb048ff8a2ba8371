"""The backend-tool registry: the specs a step offers are made once per registry."""

import json

from tools.registry import BackendTool, ToolSpecs, backend_tool_specs, backend_tools_added

ECHO = BackendTool(
    name="echo_ünïcode",
    description="Says it back: «ok».",
    arguments={"type": "object", "properties": {"text": {"type": "string"}}},
    handler=lambda context, arguments: arguments,
    title="Echo",
)


def test_specs_measure_their_json_as_the_budget_reads_it():
    for specs in ([], [ECHO.openai_spec()], [ECHO.openai_spec(), {"é": [1, 2]}]):
        assert ToolSpecs.of(specs).json_chars == len(json.dumps(specs, ensure_ascii=False))
    both = ToolSpecs.of([ECHO.openai_spec()]) + ToolSpecs.of([{"x": "y"}])
    assert both.json_chars == len(json.dumps(list(both.specs), ensure_ascii=False))


def test_the_specs_follow_the_registry():
    before = backend_tool_specs()
    assert backend_tool_specs() is before  # made once
    with backend_tools_added(ECHO):
        added = backend_tool_specs()
        assert added.specs == (*before.specs, ECHO.openai_spec())
    assert backend_tool_specs().specs == before.specs
