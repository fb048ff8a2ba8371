"""The turn engine: a turn can pause, be answered and resume; every call gets one result.

Entry points (for views and consumers):
- `turn_prepare(session_id=, user=, request=)` does everything that can refuse a request
  (4xx) before any stream starts: claim the session, take an approval decision, check a
  reader's answer. It returns a `PreparedTurn` holding the claim.
- `turn_launch(prepared, listener=)` runs the turn as a task of its own (never inside a
  request or a consumer's receive): a caller that goes away does not stop it.

The invariants of ../shared/ENGINE.md hold here: one turn per session (a leased claim), a
pause is a row, a decision is taken once, events are emitted after what they report is stored.
"""

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from geosense.annotations.selectors import annotation_counts
from tools import client as client_tools
from tools.registry import (
    BackendTool,
    ToolContext,
    ToolRun,
    backend_tool,
    backend_tool_run,
    backend_tools,
    refusal,
)
from tools.schemas import arguments_decode, validation_error

from . import approvals, selectors, services
from .agents import AgentError, TextDelta, Thinking, ToolCallRequest, agent_configured
from .agents.base import Agent
from .agents.prompts import system_prompt
from .events import EventSink, TurnEvent
from .models import ChatSession, Message, PendingDecision

logger = logging.getLogger(__name__)

MAX_STEPS = 8
SUBTURN_MAX_STEPS = 4
CLIENT_TOOL_ANSWER_LIMIT = 3
CONTEXT_TYPES = frozenset({"visibility", "position", "image", "selection"})

db = sync_to_async  # ORM work runs in the thread pool, never on the event loop

_running: set[asyncio.Task] = set()


class TurnRefused(Exception):
    """The request cannot start or resume a turn: answered 4xx before any stream."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class NewMessage:
    text: str
    contexts: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ApprovalAnswer:
    approval_id: int
    decision: approvals.Decision


@dataclass(frozen=True)
class DecisionAnswer:
    tool_call_id: str
    result: dict[str, Any]


TurnRequest = NewMessage | ApprovalAnswer | DecisionAnswer


@dataclass
class PreparedTurn:
    session_id: Any
    user: Any
    turn: int
    request: TurnRequest
    # For a resume: the assistant message whose remaining calls continue first.
    resume_message_id: int | None = None
    approval_outcome: approvals.DecisionOutcome | None = None


# --- preparing (may refuse) ------------------------------------------------------------------


def _contexts_checked(contexts: Any) -> list[dict[str, Any]]:
    if contexts is None:
        return []
    if not isinstance(contexts, list) or len(contexts) > 8:
        raise TurnRefused("contexts must be a list of at most 8 {type, data} objects", status=400)
    for item in contexts:
        if (
            not isinstance(item, dict)
            or item.get("type") not in CONTEXT_TYPES
            or "data" not in item
        ):
            raise TurnRefused(
                f"each context needs a type ({', '.join(sorted(CONTEXT_TYPES))}) and data",
                status=400,
            )
    return contexts


def _prepare_sync(*, session_id: Any, user: Any, request: TurnRequest) -> PreparedTurn:
    if isinstance(request, NewMessage):
        contexts = _contexts_checked(request.contexts)
        if not request.text.strip():
            raise TurnRefused("text must not be empty", status=400)
    try:
        services.session_claim(session_id=session_id)
    except services.SessionBusy:
        raise TurnRefused("a turn is already running in this session", status=409) from None
    try:
        if isinstance(request, NewMessage):
            services.pauses_set_aside(session_id=session_id)
            services.history_repair(session_id=session_id)
            turn = services.turn_begin(session_id=session_id)
            message = services.message_store(
                session_id=session_id, turn=turn, role=Message.Role.USER, content=request.text
            )
            for context in contexts:
                services.artifact_save(
                    session_id=session_id,
                    kind=context["type"],
                    data=context["data"],
                    origin=f"client:{context['type']}",
                    message_id=message.pk,
                )
            return PreparedTurn(session_id=session_id, user=user, turn=turn, request=request)
        if isinstance(request, ApprovalAnswer):
            approval = approvals.approval_check(
                session_id=session_id, approval_id=request.approval_id
            )
            outcome = approvals.approval_decide(
                session_id=session_id, approval_id=approval.pk, decision=request.decision, user=user
            )
            return PreparedTurn(
                session_id=session_id,
                user=user,
                turn=approval.message.turn,
                request=request,
                resume_message_id=approval.message_id,
                approval_outcome=outcome,
            )
        return _prepare_decision(session_id=session_id, user=user, request=request)
    except approvals.ApprovalConflict as exc:
        services.session_release(session_id=session_id)
        raise TurnRefused(str(exc), status=exc.status) from None
    except TurnRefused:
        services.session_release(session_id=session_id)
        raise
    except BaseException:
        services.session_release(session_id=session_id)
        raise


def _prepare_decision(*, session_id: Any, user: Any, request: DecisionAnswer) -> PreparedTurn:
    decision = (
        PendingDecision.objects.filter(session_id=session_id, tool_call_id=request.tool_call_id)
        .select_related("message")
        .first()
    )
    if decision is None:
        raise TurnRefused("unknown tool call", status=404)
    if decision.status != PendingDecision.Status.PENDING:
        raise TurnRefused(f"tool call already {decision.status.replace('_', ' ')}", status=409)
    problem = validation_error(schema=decision.result_schema or {}, value=request.result)
    if problem:
        raise TurnRefused(
            f"the result does not match {decision.name}'s result schema: {problem}", status=400
        )
    with transaction.atomic():
        changed = PendingDecision.objects.filter(
            pk=decision.pk, status=PendingDecision.Status.PENDING
        ).update(status=PendingDecision.Status.ANSWERED, answered_at=timezone.now())
        if not changed:
            raise TurnRefused("tool call already answered", status=409)
        services.tool_result_store(
            session_id=session_id,
            turn=decision.message.turn,
            tool_call_id=decision.tool_call_id,
            tool_name=decision.name,
            content=request.result,
        )
    return PreparedTurn(
        session_id=session_id,
        user=user,
        turn=decision.message.turn,
        request=request,
        resume_message_id=decision.message_id,
    )


async def turn_prepare(*, session_id: Any, user: Any, request: TurnRequest) -> PreparedTurn:
    return await db(_prepare_sync)(session_id=session_id, user=user, request=request)


# --- running ---------------------------------------------------------------------------------


def turn_launch(
    prepared: PreparedTurn,
    *,
    listener: Callable[[TurnEvent], None] | None = None,
    agent: Agent | None = None,
) -> asyncio.Task:
    """Run the prepared turn as its own task; `listener` sees its events as they happen."""
    sink = EventSink(session_id=prepared.session_id, listeners=[listener] if listener else [])
    runner = TurnRunner(prepared=prepared, sink=sink, agent=agent or agent_configured())
    task = asyncio.create_task(runner.run(), name=f"turn {prepared.session_id}#{prepared.turn}")
    _running.add(task)
    task.add_done_callback(_running.discard)
    return task


async def turns_settle() -> None:
    """Wait for every running turn task of this process (tests and shutdown)."""
    while _running:
        await asyncio.gather(*list(_running), return_exceptions=True)


PAUSED = object()


@dataclass
class TurnRunner:
    prepared: PreparedTurn
    sink: EventSink
    agent: Agent

    @property
    def session_id(self) -> Any:
        return self.prepared.session_id

    @property
    def turn(self) -> int:
        return self.prepared.turn

    async def run(self) -> None:
        keeper = asyncio.create_task(self._keep_lease())
        try:
            await self.sink.emit("turn_start", {"session": str(self.session_id), "turn": self.turn})
            if self.prepared.resume_message_id is not None:
                if await self._resume() is PAUSED:
                    return
            await self._loop()
        except asyncio.CancelledError:
            raise
        except AgentError as exc:
            await self._fail(str(exc))
        except Exception:
            logger.exception("turn %s#%s failed", self.session_id, self.turn)
            await self._fail(
                "Something went wrong while answering. The conversation is saved; please try again."
            )
        finally:
            keeper.cancel()
            await asyncio.shield(self._finish())

    async def _keep_lease(self) -> None:
        """Renew the claim while the turn runs (a long model stream or client-tool wait)."""
        while True:
            await asyncio.sleep(services.TURN_LEASE.total_seconds() / 4)
            await db(services.session_lease_renew)(session_id=self.session_id)

    async def _finish(self) -> None:
        try:
            await db(services.history_repair)(session_id=self.session_id)
        finally:
            await db(services.session_release)(session_id=self.session_id)
            try:
                await self.sink.emit("turn_end", {})
            except Exception:
                logger.exception("could not emit turn_end")

    async def _fail(self, message: str) -> None:
        await db(services.message_store)(
            session_id=self.session_id, turn=self.turn, role=Message.Role.NOTE, content=message
        )
        await self.sink.emit("error", {"message": message})

    # -- resuming a pause --

    async def _resume(self) -> object | None:
        message = await db(Message.objects.get)(pk=self.prepared.resume_message_id)
        outcome = self.prepared.approval_outcome
        if outcome is not None:
            await self._apply_decision(message, outcome)
        remaining = await db(selectors.calls_without_result)(message=message)
        return await self._process_calls(message, remaining)

    async def _apply_decision(self, message: Message, outcome: approvals.DecisionOutcome) -> None:
        approval = outcome.approval
        call = {"id": approval.tool_call_id, "name": approval.tool_name}
        tool = backend_tool(approval.tool_name)
        if outcome.shortfall is not None:
            await self._store_and_report(
                call,
                approval.arguments,
                refusal(outcome.shortfall.for_model),
            )
            await self.sink.emit("error", {"message": outcome.shortfall.for_user})
        elif approval.status != "approved" or tool is None:
            await self._store_and_report(
                call, approval.arguments, refusal(approvals.DECLINED_RESULT)
            )
        else:
            run = await backend_tool_run(
                tool=tool, arguments=approval.arguments, context=self._tool_context()
            )
            await self._store_and_report(call, approval.arguments, run)

    # -- the loop --

    async def _loop(self) -> None:
        for _ in range(MAX_STEPS):
            await db(services.session_lease_renew)(session_id=self.session_id)
            toolset = await db(client_tools.client_toolset_of_session)(session_id=self.session_id)
            history = await self._history()
            specs = [t.openai_spec() for t in backend_tools()]
            if toolset is not None:
                specs += [t.openai_spec() for t in toolset.tools.values()]
            text, calls = await self._ask(history, specs, stream=True)
            message = await db(services.message_store)(
                session_id=self.session_id,
                turn=self.turn,
                role=Message.Role.ASSISTANT,
                content=text,
                tool_calls=await db(services.tool_calls_with_fresh_ids)(
                    session_id=self.session_id,
                    calls=[{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls],
                ),
            )
            if not calls:
                await self.sink.emit(
                    "message", await db(selectors.message_get)(message_id=message.pk)
                )
                return
            if await self._process_calls(message, message.tool_calls, toolset=toolset) is PAUSED:
                return
        note = f"I stopped after {MAX_STEPS} steps without a final answer. Please rephrase or narrow the request."
        final = await db(services.message_store)(
            session_id=self.session_id, turn=self.turn, role=Message.Role.ASSISTANT, content=note
        )
        await self.sink.emit("message", await db(selectors.message_get)(message_id=final.pk))

    async def _history(self) -> list[dict[str, Any]]:
        overview = await db(annotation_counts)()
        history = await db(selectors.llm_history)(session_id=self.session_id)
        return [{"role": "system", "content": system_prompt(overview=overview)}, *history]

    async def _ask(
        self, history: list[dict[str, Any]], specs: list[dict[str, Any]], *, stream: bool
    ) -> tuple[str, list[ToolCallRequest]]:
        parts: list[str] = []
        calls: list[ToolCallRequest] = []
        async for chunk in self.agent.stream(history=history, tools=specs):
            if isinstance(chunk, TextDelta):
                parts.append(chunk.text)
                if stream:
                    await self.sink.emit("text_delta", {"delta": chunk.text})
            elif isinstance(chunk, Thinking):
                if stream:
                    await self.sink.emit("backend_thinking", {"text": chunk.text})
            else:
                calls.append(chunk)
        text = "".join(parts)
        if stream and calls and text.strip():
            await self.sink.emit("backend_thinking", {"text": text.strip()})
        return text, calls

    async def _process_calls(
        self,
        message: Message,
        calls: list[dict[str, Any]],
        *,
        toolset: client_tools.ClientToolset | None = None,
    ) -> object | None:
        """Answer each call in order; a call that must wait pauses the turn here."""
        if toolset is None:
            toolset = await db(client_tools.client_toolset_of_session)(session_id=self.session_id)
        for call in calls:
            try:
                arguments = arguments_decode(call.get("arguments"))
            except ValueError as exc:
                await self._store_and_report(
                    call,
                    {},
                    refusal(f"Invalid arguments for {call['name']}: {exc}."),
                )
                continue
            tool = backend_tool(call["name"])
            if tool is not None:
                outcome = await self._backend_call(message, call, tool, arguments)
            elif toolset is not None and call["name"] in toolset.tools:
                outcome = await self._client_call(message, call, toolset, arguments)
            else:
                outcome = await self._store_and_report(
                    call,
                    arguments,
                    refusal(f"There is no tool named {call['name']!r}."),
                )
            if outcome is PAUSED:
                await self.sink.emit(
                    "message", await db(selectors.message_get)(message_id=message.pk)
                )
                return PAUSED
            await db(services.session_lease_renew)(session_id=self.session_id)
        return None

    async def _store_and_report(
        self, call: dict[str, Any], arguments: dict[str, Any], run: ToolRun
    ) -> None:
        await db(services.tool_result_store)(
            session_id=self.session_id,
            turn=self.turn,
            tool_call_id=call["id"],
            tool_name=call["name"],
            content=run.content,
            is_error=not run.ok,
        )
        if backend_tool(call["name"]) is not None:
            event: dict[str, Any] = {
                "call_id": call["id"],
                "name": call["name"],
                "arguments": arguments,
                "ok": run.ok,
            }
            if not run.ok:
                event["error"] = run.error
            await self.sink.emit("backend_tool_call", event)

    async def _backend_call(
        self, message: Message, call: dict[str, Any], tool: BackendTool, arguments: dict[str, Any]
    ) -> object | None:
        problem = validation_error(schema=tool.arguments, value=arguments)
        if problem:
            return await self._store_and_report(
                call,
                arguments,
                refusal(f"Invalid arguments for {tool.name}: {problem}. Fix them and call again."),
            )
        session = await db(ChatSession.objects.get)(pk=self.session_id)
        reasons = approvals.approval_reasons(
            tool=tool, allow_backend_tools=session.allow_backend_tools
        )
        shortfall = await db(approvals.credits_shortfall)(user=self.prepared.user, tool=tool)
        if shortfall is not None:
            await self._store_and_report(call, arguments, refusal(shortfall.for_model))
            await self.sink.emit("error", {"message": shortfall.for_user})
            return None
        if reasons:
            await db(services.approval_create)(
                session_id=self.session_id,
                message=message,
                call=call,
                arguments=arguments,
                reasons=reasons,
                cost=tool.cost_credits,
            )
            return PAUSED
        run = await backend_tool_run(tool=tool, arguments=arguments, context=self._tool_context())
        return await self._store_and_report(call, arguments, run)

    async def _client_call(
        self,
        message: Message,
        call: dict[str, Any],
        toolset: client_tools.ClientToolset,
        arguments: dict[str, Any],
    ) -> object | None:
        tool = toolset.tools[call["name"]]
        await self.sink.emit(
            "client_tool_call",
            {"call_id": call["id"], "name": tool.name, "arguments": arguments, "kind": tool.kind},
        )
        answered = await db(selectors.client_tool_answers_in_turn)(
            session_id=self.session_id, turn=self.turn, name=tool.name
        )
        if answered >= CLIENT_TOOL_ANSWER_LIMIT:
            return await self._store_and_report(
                call,
                arguments,
                refusal(
                    f"{tool.name} was already answered {answered} times in this turn. Stop calling it and answer with what you have."
                ),
            )
        problem = validation_error(schema=tool.arguments, value=arguments)
        if problem:
            return await self._store_and_report(
                call,
                arguments,
                refusal(
                    f"Invalid arguments for {tool.name}: {problem}. Nothing was sent to the client."
                ),
            )
        if tool.kind == "one-way":
            return await self._store_and_report(
                call,
                arguments,
                ToolRun(ok=True, content={"ok": True, "delivered": "shown to the user"}),
            )
        if not tool.serve:
            await db(services.decision_create)(
                session_id=self.session_id,
                message=message,
                call=call,
                arguments=arguments,
                result_schema=tool.result or {},
            )
            return PAUSED
        answer = await client_tools.client_tool_request(
            channel_name=toolset.channel_name,
            tool=tool,
            arguments=arguments,
            timeout=settings.GEOSENSE_CLIENT_TOOL_TIMEOUT,
        )
        content = (
            answer.result
            if answer.ok and answer.result is not None
            else {"error": answer.error or "no answer"}
        )
        return await self._store_and_report(call, arguments, ToolRun(ok=answer.ok, content=content))

    # -- tools' context and sub-turns --

    def _tool_context(self) -> ToolContext:
        session_id = self.session_id

        def save(*, kind: str, data: Any, origin: str) -> str:
            return services.artifact_save(
                session_id=session_id, kind=kind, data=data, origin=origin
            )

        return ToolContext(
            session_id=session_id,
            user_id=self.prepared.user.pk,
            artifact_save=save,
            subturn=self._subturn,
        )

    async def _subturn(self, *, instructions: str, tool_names: frozenset[str]) -> str:
        """A sub-turn in memory: read-only backend tools only, never client tools or approvals."""
        tools = [
            t
            for t in backend_tools()
            if t.name in tool_names and t.read_only and not t.destructive and not t.cost_credits
        ]
        by_name = {t.name: t for t in tools}
        overview = await db(annotation_counts)()
        history: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt(overview=overview)},
            {"role": "user", "content": instructions},
        ]
        context = self._tool_context()
        for _ in range(SUBTURN_MAX_STEPS):
            text, calls = await self._ask(history, [t.openai_spec() for t in tools], stream=False)
            if not calls:
                return text
            history.append(
                {
                    "role": "assistant",
                    "content": text or None,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments},
                        }
                        for c in calls
                    ],
                }
            )
            for call in calls:
                tool = by_name.get(call.name)
                if tool is None:
                    run = refusal(f"{call.name} is not available to a sub-agent.")
                else:
                    try:
                        run = await backend_tool_run(
                            tool=tool, arguments=arguments_decode(call.arguments), context=context
                        )
                    except ValueError as exc:
                        run = refusal(str(exc))
                history.append(
                    {"role": "tool", "tool_call_id": call.id, "content": _json_text(run.content)}
                )
        return "The helper agent did not finish within its step limit."


def _json_text(content: dict[str, Any]) -> str:
    return json.dumps(content, ensure_ascii=False)
