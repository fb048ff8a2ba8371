"""The backend-tool registry: each tool declared once, validated and run the same way.

A tool's handler gets a `ToolContext` and its validated arguments and returns a JSON object
for the model. A `ToolError` (or any exception) becomes a readable refusal for the model: the
turn goes on. Large payloads go into artifacts through `ToolContext.artifact_save`, and the
model gets a short summary naming the `artifact_id`.

The built-in tools (`tools.builtin`) are registered once, by `ToolsConfig.ready()`; tests add
their own for a while with `backend_tools_added`.
"""

import asyncio
import functools
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from asgiref.sync import sync_to_async

from .schemas import schema_check, validation_problem

logger = logging.getLogger(__name__)


class ToolError(Exception):
    """A refusal the model should read (bad ids, nothing found, …)."""


class ArtifactSaver(Protocol):
    def __call__(self, *, kind: str, data: Any, origin: str) -> str: ...


class SubturnRunner(Protocol):
    async def __call__(self, *, instructions: str, tool_names: frozenset[str]) -> str: ...


@dataclass(frozen=True)
class ToolContext:
    """What a handler may do beyond computing its result."""

    artifact_save: ArtifactSaver
    # Runs a sub-turn with a restricted set of backend tools (never client tools).
    subturn: SubturnRunner | None = None


Handler = Callable[[ToolContext, dict[str, Any]], dict[str, Any] | Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class BackendTool:
    """A tool on the server. `description` is for the model; `title` and `summary` are for a
    person: the cards the page shows (approval, activity log) name the tool by its title ("Find
    annotations near others") and a call by its summary ("Trees within 20 m of a house"), never
    by the code name and raw arguments. Every registered tool declares both."""

    name: str
    description: str
    arguments: Mapping[str, Any]
    handler: Handler
    cost_credits: int = 0
    destructive: bool = False
    title: str = ""
    # One line for a person: what a call with these (valid) arguments will do.
    summary: Callable[[dict[str, Any]], str] = field(default=lambda arguments: "")
    # Safe for a sub-turn: reads only, costs nothing.
    read_only: bool = True
    # The Django permission a user needs to call it at all ("" for every user): the
    # annotations are one shared dataset, and only its curators may delete from it.
    permission: str = ""

    def openai_spec(self) -> dict[str, Any]:
        """The tool as a request offers it: made once (shared: never changed)."""
        return self._spec

    @functools.cached_property
    def _spec(self) -> dict[str, Any]:
        return openai_function_spec(
            name=self.name, description=self.description, parameters=dict(self.arguments)
        )

    def summary_of(self, arguments: dict[str, Any]) -> str:
        """The call's summary; arguments that do not fit (an invalid call) get none."""
        try:
            return self.summary(arguments)
        except Exception:
            return ""

    async def arguments_refusal(self, arguments: dict[str, Any]) -> "ToolRun | None":
        """The refusal the model reads when its arguments do not match, else None (checked
        in the schema worker: the arguments are the model's)."""
        problem = await validation_problem(schema=self.arguments, value=arguments)
        if problem:
            return refusal(
                f"Invalid arguments for {self.name}: {problem}. Fix them and call again.",
                for_user=ASKED_WRONGLY,
            )
        return None


def openai_function_spec(
    *, name: str, description: str, parameters: Mapping[str, Any]
) -> dict[str, Any]:
    """A tool as OpenAI-compatible chat-completions servers take it (`tools=[…]`)."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


@dataclass(frozen=True)
class ToolSpecs:
    """Tools as a model request offers them (`openai_spec`s), with the length of each one's
    JSON (`json.dumps`, not ASCII-escaped), which the history's token budget counts: measured
    once per set of tools, not at every step (issue 15: writing every spec's JSON for that
    was a tenth of the database thread's work per turn)."""

    specs: tuple[dict[str, Any], ...] = ()
    chars: tuple[int, ...] = ()

    @classmethod
    def of(cls, specs: Iterable[dict[str, Any]]) -> "ToolSpecs":
        specs = tuple(specs)
        return cls(specs, tuple(len(json.dumps(spec, ensure_ascii=False)) for spec in specs))

    def __add__(self, other: "ToolSpecs") -> "ToolSpecs":
        return ToolSpecs(self.specs + other.specs, self.chars + other.chars)

    @property
    def json_chars(self) -> int:
        """`len(json.dumps(list(self.specs), ensure_ascii=False))`, without writing it."""
        return 2 + sum(self.chars) + 2 * max(0, len(self.chars) - 1)


#: What the page says of a call whose arguments did not fit (the model reads the details).
ASKED_WRONGLY = "The assistant asked for it in a way it does not accept; it was told what to fix."
#: What the page says of a call that failed inside the server (the log has the details).
FAILED_INSIDE = "It failed on the server; the administrator can see why."


@dataclass(frozen=True)
class ToolRun:
    """A call's result. `content` is what the model reads (and the admin sees); a refusal may
    carry `for_user`, the same outcome in words for a person, when the model's text is
    technical."""

    ok: bool
    content: dict[str, Any]
    for_user: str | None = None

    @property
    def error(self) -> str | None:
        return None if self.ok else str(self.content.get("error", "failed"))

    @property
    def problem(self) -> str | None:
        """Why it failed, for a person (None when it did not fail)."""
        return None if self.ok else (self.for_user or self.error)


_REGISTRY: dict[str, BackendTool] = {}
# The registered tools' specs, made at the first step after the registry changed.
_specs: ToolSpecs | None = None


def backend_tool_register(tool: BackendTool) -> BackendTool:
    if tool.name in _REGISTRY:
        raise ValueError(f"backend tool {tool.name!r} is declared twice")
    if not tool.title.strip():
        raise ValueError(f"backend tool {tool.name!r} needs a title for the page's cards")
    schema_check(tool.arguments, what=f"{tool.name} arguments")
    _REGISTRY[tool.name] = tool
    _registry_changed()
    return tool


def _registry_changed() -> None:
    global _specs
    _specs = None


@contextmanager
def backend_tools_added(*tools: BackendTool) -> Iterator[None]:
    """Register `tools` for the duration of a `with` block (tests); then they are gone."""
    for tool in tools:
        backend_tool_register(tool)
    try:
        yield
    finally:
        for tool in tools:
            _REGISTRY.pop(tool.name, None)
        _registry_changed()


def backend_tools() -> list[BackendTool]:
    return list(_REGISTRY.values())


def backend_tool_specs() -> ToolSpecs:
    """Every registered tool's spec, as every step offers them (made once per registry)."""
    global _specs
    specs = _specs
    if specs is None:
        specs = _specs = ToolSpecs.of(tool.openai_spec() for tool in list(_REGISTRY.values()))
    return specs


def backend_tool(name: str) -> BackendTool | None:
    return _REGISTRY.get(name)


def backend_tool_names() -> frozenset[str]:
    return frozenset(_REGISTRY)


def refusal(message: str, *, for_user: str | None = None) -> ToolRun:
    """A call that did not run: `message` for the model, `for_user` for a person when the
    message is not already plain words."""
    return ToolRun(ok=False, content={"error": message}, for_user=for_user)


async def backend_tool_run(
    *, tool: BackendTool, arguments: dict[str, Any], context: ToolContext
) -> ToolRun:
    """Run the handler on arguments the caller validated (`BackendTool.arguments_refusal`),
    and always return a result."""
    try:
        if inspect.iscoroutinefunction(tool.handler):
            content = await tool.handler(context, arguments)
        else:
            content = await sync_to_async(tool.handler, thread_sensitive=True)(context, arguments)
    except asyncio.CancelledError:
        raise
    except ToolError as exc:
        return refusal(str(exc))
    except Exception as exc:
        logger.exception("backend tool %s failed", tool.name)
        return refusal(
            f"{tool.name} failed with an internal error ({type(exc).__name__}).",
            for_user=FAILED_INSIDE,
        )
    return ToolRun(ok=True, content=content)
