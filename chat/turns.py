"""The turn engine: a turn can pause, be answered and resume; every call gets one result.

Entry points (for views and consumers):
- `turn_prepare(session_id=, user=, request=)` does everything that can refuse a request
  before any stream starts: claim the session, take an approval decision, take a reader's
  answer. It raises the domain's refusals (`TurnRequestInvalid`, `services.SessionBusy`,
  `approvals.PauseNotFound`, `PauseConflict`, `AnswerInvalid`) and returns a `PreparedTurn`
  holding the claim.
- `turn_launch(prepared, listener=)` runs the turn as a task of its own (never inside a
  request or a consumer's receive): a caller that goes away does not stop it.

The engine invariants of docs/architecture.md hold here: one result per call, one turn per
session (a leased claim), a pause is a row, a decision is taken once, and events are emitted
after what they report is stored.
"""

import asyncio
import enum
import json
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import OperationalError

from geosense import wire
from geosense.annotations.selectors import annotation_overview
from geosense.annotations.types import DatasetOverview
from geosense.dbpool import in_db_thread, work_advance, work_begin
from tools import client as client_tools
from tools.registry import (
    BackendTool,
    ToolContext,
    ToolRun,
    backend_tool,
    backend_tool_run,
    backend_tool_specs,
    backend_tools,
    refusal,
)
from tools.schemas import arguments_decode

from . import approvals, processes, selectors, services, usage
from .agents import (
    AgentContext,
    AgentError,
    TextDelta,
    Thinking,
    ToolCallRequest,
    Usage,
    UserRequest,
    agent_configured,
)
from .agents.base import Agent
from .agents.prompts import system_prompt
from .events import EventSink
from .history import LEFT_OUT_NOTE, history_budget, history_rows_stored, history_window
from .models import ChatSession, Message

logger = logging.getLogger(__name__)

MAX_STEPS = 8
SUBTURN_MAX_STEPS = 4
CLIENT_TOOL_ANSWER_LIMIT = 3
STEP_LIMIT_NOTE = (
    f"I stopped after {MAX_STEPS} steps without a final answer. "
    "Please rephrase or narrow the request."
)
FAILED_NOTE = "Something went wrong while answering. The conversation is saved; please try again."
# Before an agent's own words about its failure (its model server's, for instance): the note and
# the `error` event are read by a person as they are.
AGENT_FAILED = "The assistant could not answer."
ONE_WAY_DELIVERED = {"ok": True, "delivered": "shown to the user"}
# The streamed text is stored at most this long after it was shown (`_Draft`).
DRAFT_SECONDS = 1.0
# A step, or a call's result, renews the claim's lease only when it was last renewed (or taken)
# longer ago than this: the keeper (`_lease_keep`) renews it as often whatever the turn does.
STEP_RENEW_SECONDS = services.TURN_LEASE.total_seconds() / 4

_running: set[asyncio.Task] = set()


def in_thread(function: Callable) -> Callable:
    """Run blocking work (the ORM) in the engine's bounded pool, never on the event loop
    (`geosense.dbpool`: a few threads and connections however many turns run)."""
    return in_db_thread(function)


class TurnUnavailable(Exception):
    """The database could not take the turn now (locked or unreachable): nothing was stored,
    the session is not claimed, the request may be sent again."""


class TurnRequestInvalid(ValueError):
    """The request cannot start a turn as sent (empty text, malformed contexts)."""


@dataclass(frozen=True)
class NewMessage:
    text: str
    contexts: list[wire.DataContext] = field(default_factory=list)


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
    approval_outcome: approvals.ApprovalOutcome | None = None
    # When the claim was taken (time.monotonic(), read before its write): its lease is fresh
    # until then + a quarter.
    claimed: float = field(default_factory=time.monotonic)
    # The agent the turn runs with, chosen as it is prepared (`turn_prepare`).
    agent: Agent | None = None
    # A new message's first step's inputs, read in its preparation's trip (`_read_ahead`).
    ahead: "_StepInputs | None" = None


@dataclass
class _Draft:
    """The assistant's text of one step as it streams, stored at most `DRAFT_SECONDS` after
    each delta (one write a second at most, whatever the rate of deltas), so a crash or a
    failed stream keeps what the user saw (`Message.cut_off`).

    The wait is a timer of the loop, and a save, when it is due, a task of its own (`_saving`)
    that `close` lets end first: a step streams for less than a second nearly always, and a task
    sleeping to be cancelled, with the lock `close` took, cost ~15 Python calls on the loop a
    step (asyncio's task registry, the task's steps into and out of its sleep, the lock's)."""

    session_id: Any
    turn: int
    parts: list[str] = field(default_factory=list)
    draft_id: int | None = None
    closed: bool = False
    _timer: asyncio.TimerHandle | None = None  # from a delta until the save it waits for ends
    _saving: asyncio.Task | None = None

    def add(self, text: str) -> None:
        self.parts.append(text)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(DRAFT_SECONDS, self._save_due)

    def _save_due(self) -> None:
        self._saving = asyncio.ensure_future(self._save_timed())

    async def _save_timed(self) -> None:
        try:
            if not self.closed:  # closed since the timer fired: `close` stores what it must
                await self._save()
        finally:
            self._saving = self._timer = None  # the next delta waits again

    async def _save(self) -> None:
        self.draft_id = await in_thread(services.message_draft_save)(
            session_id=self.session_id,
            turn=self.turn,
            draft_id=self.draft_id,
            content="".join(self.parts),
        )

    async def close(self, *, cut_off: bool = False) -> int | None:
        """Stop saving; with `cut_off` (the stream broke) store the text shown so far. Returns
        the draft's id, if one was stored (a completed step's message takes it over)."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()  # one that fired already is left as it is
            self._timer = None  # it holds this draft: no cycle for the collector
        if self._saving is not None:  # a save under way ends first: its id is the draft's
            await asyncio.wait({self._saving})
        if cut_off and "".join(self.parts).strip():
            await self._save()
        return self.draft_id


@dataclass(frozen=True)
class _StepInputs:
    """What one step asks the model with (`TurnRunner._step_inputs`)."""

    toolset: client_tools.ClientToolset | None
    specs: list[dict[str, Any]]
    history: list[dict[str, Any]]
    context: AgentContext
    images: bool  # the newest user message's pictures are image parts (`history_window`)


@dataclass(frozen=True)
class _StepStored:
    """A step's stored message; `shown`: as the page shows it, when it is the turn's answer."""

    message: Message
    shown: Any


class CallOutcome(enum.Enum):
    """What answering one call did to the turn."""

    ANSWERED = "answered"  # the call has its result; the step goes on
    PAUSED = "paused"  # the call waits on a pause row; the turn ends here until it is decided


# --- preparing (may refuse) ------------------------------------------------------------------


def _contexts_checked(contexts: Any) -> list[wire.DataContext]:
    if contexts is None:
        return []
    if not isinstance(contexts, list) or len(contexts) > wire.CONTEXTS_MAX:
        raise TurnRequestInvalid(
            f"contexts must be a list of at most {wire.CONTEXTS_MAX} {{type, data}} objects"
        )
    for item in contexts:
        if (
            not isinstance(item, dict)
            or item.get("type") not in wire.CONTEXT_TYPES
            or "data" not in item
        ):
            raise TurnRequestInvalid(
                f"each context needs a type ({', '.join(sorted(wire.CONTEXT_TYPES))}) and data"
            )
    return contexts


def _prepare_message(
    *, session_id: Any, user: Any, request: NewMessage, numbered: "_Facts | None"
) -> PreparedTurn:
    """Set the pauses aside, repair, number the turn (only once the repair went through,
    engine invariant 1) and store the message, with one read of the session for its count,
    title, open pauses and latest turns' calls and results (`pauses_set_aside` runs only when
    one is open; the repair then reads them again). Under the claim
    nothing else writes either, so the repair reads no pause (all were set aside just now)
    and the numbering is one conditional update. `numbered`: the facts read before the claim,
    which numbered the turn (there was nothing to set aside or repair): none of that again."""
    if numbered is not None:
        count, titled = numbered.count, numbered.titled
        turn = count + 1
    else:
        count, titled, paused, _, unsettled = services.session_turn_facts(session_id=session_id)
        if paused:
            approvals.pauses_set_aside(session_id=session_id)
            unsettled = None  # the results it stored are read with the rest
        services.history_repair(
            session_id=session_id, turn_count=count, pauses_open=False, unsettled=unsettled
        )
        turn = services.turn_begin(session_id=session_id, count=count)
    message = services.message_store(
        session_id=session_id,
        turn=turn,
        role=Message.Role.USER,
        content=request.text,
        titled=titled,
    )
    for context in request.contexts:
        services.artifact_save(
            session_id=session_id,
            kind=context["type"],
            data=context["data"],
            origin=f"client:{context['type']}",
            message_id=message.pk,
        )
    if not request.contexts:  # the window's kept rows know it (one with contexts is read)
        history_rows_stored(session_id=session_id, messages=[message], first=count == 0)
    return PreparedTurn(session_id=session_id, user=user, turn=turn, request=request)


def _prepare_approval(*, session_id: Any, user: Any, request: ApprovalAnswer) -> PreparedTurn:
    outcome = approvals.approval_decide(
        session_id=session_id, approval_id=request.approval_id, decision=request.decision, user=user
    )
    return PreparedTurn(
        session_id=session_id,
        user=user,
        turn=outcome.approval.message.turn,
        request=request,
        resume_message_id=outcome.approval.message_id,
        approval_outcome=outcome,
    )


def _prepare_decision(*, session_id: Any, user: Any, request: DecisionAnswer) -> PreparedTurn:
    decision = approvals.decision_answer(
        session_id=session_id, tool_call_id=request.tool_call_id, result=request.result
    )
    return PreparedTurn(
        session_id=session_id,
        user=user,
        turn=decision.message.turn,
        request=request,
        resume_message_id=decision.message_id,
    )


@dataclass(frozen=True)
class _Facts:
    """What a new message's preparation takes from the session's facts read before its claim."""

    count: int  # the session's turn count
    titled: bool


def _facts_settled(session_id: Any) -> _Facts | None:
    """A new message's session facts, read before the claim, when they show no turn holding
    the session and nothing to set aside or repair (no pause open, every call of the latest
    turns answered): the claim may then number the turn in the same update, conditioned on the
    count read here (any turn numbered since, which may have left something, makes it the
    claim alone, and the facts are read again under it). None otherwise (a missing session
    too: the claim refuses it, as before). Calls and pauses are written only by a turn holding
    the claim: none held it at this read (a turn that did, even one whose lease ran out, may
    store a call or a pause and release before the claim below, leaving the count as it was:
    review 32-a H1), and a later one is a new message's, which numbers its turn, or a resume's,
    which needs an open pause (this read would show it). So what the read shows holds while
    the count does, as it holds for a read under the claim (engine invariants 1, 2)."""
    try:
        count, titled, paused, idle, unsettled = services.session_turn_facts(session_id=session_id)
    except ChatSession.DoesNotExist:
        return None
    if not idle or paused or services.calls_unanswered(unsettled):
        return None
    return _Facts(count=count, titled=titled)


def _prepare_sync(
    *, session_id: Any, user: Any, request: TurnRequest, images: bool = False
) -> PreparedTurn:
    """Claim and store what the turn starts from; a new message's first step's inputs too
    (`_read_ahead`), for an agent that takes pictures as image parts if `images`."""
    if isinstance(request, NewMessage):
        request = NewMessage(text=request.text, contexts=_contexts_checked(request.contexts))
        if not request.text.strip():
            raise TurnRequestInvalid("text must not be empty")
        usage.turn_affordable_check(user=user)
    claimed = time.monotonic()  # before the claim's write: its lease runs from no later
    facts = _facts_settled(session_id) if isinstance(request, NewMessage) else None
    numbered = services.session_claim(
        session_id=session_id, numbered_from=facts.count if facts is not None else None
    )
    try:
        if isinstance(request, NewMessage):
            prepared = _prepare_message(
                session_id=session_id,
                user=user,
                request=request,
                numbered=facts if numbered else None,
            )
        elif isinstance(request, ApprovalAnswer):
            prepared = _prepare_approval(session_id=session_id, user=user, request=request)
        else:
            prepared = _prepare_decision(session_id=session_id, user=user, request=request)
        prepared.claimed = claimed
    except BaseException:
        try:
            services.session_release(session_id=session_id)
        except OperationalError:
            # The claim stays until the release goes through (retried off this request).
            _release_later(session_id)
        raise
    if isinstance(request, NewMessage):
        prepared.ahead = _step_reads_ahead(prepared, images=images)
    return prepared


def _step_reads_ahead(prepared: PreparedTurn, *, images: bool) -> "_StepInputs | None":
    """A new message's first step's inputs, read in its preparation's trip: a trip fewer a
    turn (each is a wake-up of the database thread and of the loop, and under load a wait
    behind every turn's trips; issue 15). Nothing was deferred, and the claim was just taken
    (renewed here as a step renews it, should the preparation have outlasted a quarter lease),
    so they are what the step's own trip would read. None when a read fails: the message is
    stored and the request is not refused for it; the step reads them in a trip of its own
    and meets what went wrong there, as a step does."""
    try:
        now = time.monotonic()
        if now - prepared.claimed > STEP_RENEW_SECONDS:
            services.session_lease_renew(session_id=prepared.session_id)
            prepared.claimed = now  # the lease is as fresh as a claim taken now
        return _step_reads(session_id=prepared.session_id, images=images)
    except OperationalError:
        return None  # the database is busy: the step's own trip meets it
    except Exception:
        # Not expected: shown, as the step's own read would show it (review 30-a L3).
        logger.exception("session %s: the first step's read ahead failed", prepared.session_id)
        return None


async def turn_prepare(*, session_id: Any, user: Any, request: TurnRequest) -> PreparedTurn:
    """Claim and store what the turn starts from, or refuse; `TurnUnavailable` when the
    database cannot take it now (every step before a stream is one transaction or undone).
    The turn's agent is chosen now (`agent_configured`): its first step may be read now."""
    work_begin()  # this turn's trips (its task's too) go before those of turns begun after it
    if isinstance(request, DecisionAnswer):
        await approvals.decision_answer_check(
            session_id=session_id, tool_call_id=request.tool_call_id, result=request.result
        )
    agent = agent_configured()
    try:
        prepared = await in_thread(_prepare_sync)(
            session_id=session_id, user=user, request=request, images=_accepts_images(agent)
        )
    except OperationalError as exc:
        logger.warning("turn of session %s not started: %s", session_id, exc)
        raise TurnUnavailable("the database is busy; please send the request again") from exc
    prepared.agent = agent
    return prepared


def _accepts_images(agent: Agent) -> bool:
    return getattr(agent, "accepts_images", False)


# --- releasing a claim the database refused to release ----------------------------------------

RELEASE_RETRY_SECONDS = (0.5, 1, 2, 4, 8)
_releasing: set[Any] = set()


def _release_later(session_id: Any) -> None:
    """Retry a release that failed (the database locked or gone), from a thread of its own,
    so the session becomes free as soon as the database takes writes again rather than when
    the lease runs out. At most one retrier per session."""
    if session_id in _releasing:
        return
    _releasing.add(session_id)

    def retry() -> None:
        from django.db import close_old_connections

        try:
            for wait in (*RELEASE_RETRY_SECONDS, *[10] * 12):
                time.sleep(wait)
                try:
                    services.session_release(session_id=session_id)
                    return
                except OperationalError:
                    continue
                finally:
                    close_old_connections()
            logger.error("session %s could not be released; its lease will expire", session_id)
        finally:
            _releasing.discard(session_id)

    threading.Thread(target=retry, name=f"release {session_id}", daemon=True).start()


# --- running ---------------------------------------------------------------------------------


def turn_launch(
    prepared: PreparedTurn,
    *,
    listener: Callable[[wire.TurnEvent], None] | None = None,
    agent: Agent | None = None,
) -> asyncio.Task:
    """Run the prepared turn as its own task; `listener` sees its events as they happen. It
    runs with `agent`, else the one it was prepared for."""
    sink = EventSink(session_id=prepared.session_id, listeners=[listener] if listener else [])
    agent = agent or prepared.agent or agent_configured()
    runner = TurnRunner(prepared=prepared, sink=sink, agent=agent)
    task = asyncio.create_task(runner.run(), name=f"turn {prepared.session_id}#{prepared.turn}")
    _running.add(task)
    task.add_done_callback(_running.discard)
    key = str(prepared.session_id)
    _by_session[key] = (task, runner)
    task.add_done_callback(lambda t: _by_session.get(key, (None,))[0] is t and _by_session.pop(key))
    return task


# --- stopping --------------------------------------------------------------------------------

# The turn task running for each session in this process, with its runner.
_by_session: dict[str, tuple[asyncio.Task, "TurnRunner"]] = {}
STOP_WAIT_SECONDS = 10.0
STOPPED_NOTE = "You stopped this answer."


class TurnElsewhere(Exception):
    """The session's turn runs in another server process, which this one cannot stop."""


async def turn_stop(*, session_id: Any) -> str:
    """Stop what the session's turn is doing, at any moment: "stopped" (the running turn's task
    was cancelled: what was streamed is kept, cut off, every call left without a result gets
    one, the claim is released and `turn_end` emitted), "set_aside" (the turn was paused on an
    approval or a reader's decision: the pauses are set aside, as a new message would) or
    "idle" (nothing ran: a second click). Raises `TurnElsewhere`."""
    entry = _by_session.get(str(session_id))
    if entry is not None:
        task, runner = entry
        runner.stopped = True
        task.cancel()
        # Its finish (a shielded repair, release and turn_end) completes before the answer.
        await asyncio.wait({task}, timeout=STOP_WAIT_SECONDS)
        return "stopped"
    if await in_thread(services.session_turn_running)(session_id=session_id):
        raise TurnElsewhere("the turn runs in another server process; try again in a moment")
    if await in_thread(approvals.pauses_set_aside)(session_id=session_id):
        return "set_aside"
    return "idle"


async def turns_settle() -> None:
    """Wait for every running turn task of this process (tests and shutdown)."""
    while _running:
        await asyncio.gather(*list(_running), return_exceptions=True)


async def _to_its_end(work: Coroutine[Any, Any, None]) -> None:
    """Await `work` to its end even if this task is cancelled meanwhile, then let the
    cancellation through. `asyncio.shield` alone ends the task at once and leaves the work
    running: a Stop that landed in a turn's finish answered "stopped" before the claim was
    released, and a stream that saw its task done could end without `turn_end` (review 31-b
    L6)."""
    running = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            await asyncio.shield(running)
        except asyncio.CancelledError:
            if running.done():  # the work itself was cancelled, not this task
                raise
            cancelled = True
            continue
        break
    if cancelled:
        raise asyncio.CancelledError


@dataclass
class TurnRunner:
    prepared: PreparedTurn
    sink: EventSink
    agent: Agent
    stopped: bool = False  # the person stopped it (`turn_stop`): its cancellation is theirs
    # The turn ran to its answer or its pause: no call of it is left without a result, so its
    # end has nothing to repair (a failure or a stop leaves that to `history_repair`).
    settled: bool = False
    # The stored draft of the step that just streamed (`_ask`), completed by its message.
    draft_id: int | None = None
    # Results stored in this turn per tool name (the per-turn bound of client tools): none for
    # a new message's turn, read from the database at the first client call of a resumed one,
    # then counted as results are stored.
    answers: dict[str, int] | None = None
    # When the lease was last renewed by this runner (time.monotonic()), else 0.
    renewed: float = 0.0
    # A client call's result (`services.tool_result_store`'s arguments) that the turn's next
    # trip stores before anything else (`_deferred_store`): the next step's inputs, or the end.
    deferred: dict[str, Any] | None = None
    # Tokens reported but not recorded yet: free ones of the turn's steps that called tools,
    # recorded with its next step's (one statement for both), and any request's the model failed
    # or the turn was stopped in; the turn's end records what is left (`_held_usages_record`).
    # Touched by one trip at a time: the loop appends only while no trip of the turn runs.
    held: list[Usage] = field(default_factory=list)
    # The claim's keeper (`_lease_keep`): its timer, and its renewal while one runs.
    _keeper: asyncio.TimerHandle | None = field(default=None, repr=False)
    _renewal: asyncio.Task | None = field(default=None, repr=False)

    @property
    def session_id(self) -> Any:
        return self.prepared.session_id

    @property
    def turn(self) -> int:
        return self.prepared.turn

    async def run(self) -> None:
        self._lease_keep()
        try:
            await self.sink.emit(wire.turn_start(session=self.session_id, turn=self.turn))
            if self.prepared.resume_message_id is not None:
                if await self._resume() is CallOutcome.PAUSED:
                    self.settled = True
                    return
            await self._loop()
            self.settled = True
        except asyncio.CancelledError:
            if self.stopped:
                await _to_its_end(self._stopped_note())
            raise
        except AgentError as exc:
            await self._note(f"{AGENT_FAILED} {exc}")
        except Exception:
            logger.exception("turn %s#%s failed", self.session_id, self.turn)
            await self._note(FAILED_NOTE)
        finally:
            self._keeper.cancel()
            if self._renewal is not None:
                self._renewal.cancel()
            await _to_its_end(self._finish())

    def _lease_keep(self) -> None:
        """Renew the claim every quarter lease while the turn runs (a long model stream or
        client-tool wait): a timer of the loop, whose renewal is a task of its own only when
        it is due. A keeper task sleeping to be cancelled at the turn's end cost ~8 Python
        calls on the loop a turn (asyncio's task registry, its steps into and out of its
        sleep)."""
        self._renewal = None
        self._keeper = asyncio.get_running_loop().call_later(
            services.TURN_LEASE.total_seconds() / 4, self._lease_due
        )

    def _lease_due(self) -> None:
        self._renewal = asyncio.ensure_future(self._lease_renew())

    async def _lease_renew(self) -> None:
        try:
            renewed = time.monotonic()
            await in_thread(services.session_lease_renew)(session_id=self.session_id)
            self.renewed = renewed
        except OperationalError as exc:  # the next renewal may go through
            logger.warning("turn %s#%s: lease not renewed: %s", self.session_id, self.turn, exc)
        self._lease_keep()

    async def _finish(self) -> None:
        """Repair, release, then `turn_end`, whatever the database does: a repair that fails
        is done by the next turn's preparation, a release that fails is retried until it
        goes through (`_release_later`), and the listeners always hear the end."""
        try:
            await in_thread(self._repair_and_release)()
        except OperationalError as exc:
            logger.warning("turn %s#%s: release retried: %s", self.session_id, self.turn, exc)
            _release_later(self.session_id)
        try:
            await self.sink.emit(wire.turn_end())
        except Exception:
            logger.exception("could not emit turn_end")

    def _repair_and_release(self) -> None:
        """The end of the turn in the database, in one trip to its thread: a result still
        deferred stored, then unless the turn settled (every call of it answered, or waiting
        on its pause), every call given a result (a repair the database refuses is left to the
        next turn's preparation), the tokens still held recorded, then the claim released (a
        refusal raises: the caller retries it)."""
        try:
            self._deferred_store()
            if not self.settled:
                services.history_repair(session_id=self.session_id)
        except OperationalError as exc:
            logger.warning("turn %s#%s: repair deferred: %s", self.session_id, self.turn, exc)
        if self.held:
            self._held_usages_record()
        services.session_release(session_id=self.session_id)

    def _held_usages_record(self) -> None:
        """The tokens still held at the turn's end recorded (and charged, when priced): never in
        the way of the release, whatever the database or a model server's figures do (lost,
        they are lost as a crash loses them; review 29-a H1: an error here kept the session
        running until its lease ran out, with no `turn_end`)."""
        held, self.held = self.held, []
        try:
            self._usages_record(held)
        except Exception:
            logger.exception("turn %s#%s: tokens used not recorded", self.session_id, self.turn)

    def _deferred_store(self) -> None:
        """Store the client call's result the turn deferred to this trip (first: a message
        stored after it in the same trip comes after it, as if it had had a trip of its own)."""
        if self.deferred is not None:
            self._result_store(self.deferred)
            self.deferred = None

    def _result_store(self, stored: dict[str, Any], *, lease_renew: bool = False) -> None:
        """Store a call's result (`services.tool_result_store`), which the window's kept rows
        then know (`history_rows_stored`: the next step reads no new row for it)."""
        message = services.tool_result_store(**stored, lease_renew=lease_renew)
        history_rows_stored(session_id=self.session_id, messages=[message])

    def _lease_stale(self, now: float) -> bool:
        """The claim was last taken or renewed more than `STEP_RENEW_SECONDS` before `now`."""
        return now - max(self.prepared.claimed, self.renewed) > STEP_RENEW_SECONDS

    def _note_store(self, content: str) -> None:
        self._deferred_store()
        services.message_store(
            session_id=self.session_id, turn=self.turn, role=Message.Role.NOTE, content=content
        )

    async def _stopped_note(self) -> None:
        """The transcript says the answer was stopped (after the text kept, cut off)."""
        try:
            await in_thread(self._note_store)(STOPPED_NOTE)
        except OperationalError as exc:
            logger.warning("turn %s#%s: stop note not stored: %s", self.session_id, self.turn, exc)

    async def _note(self, message: str) -> None:
        """Tell the person something went wrong (a failure, a refusal): as an `error` event for
        the page's notice, and as a note in the transcript, so it survives a reload. The note
        is stored when the database lets us (a failure that is the database's own must still
        reach the page)."""
        try:
            await in_thread(self._note_store)(message)
        except OperationalError as exc:
            logger.warning("turn %s#%s: note not stored: %s", self.session_id, self.turn, exc)
        await self.sink.emit(wire.error(message))

    async def _emit_message(self, message_id: int) -> None:
        await self.sink.emit(
            wire.message(await in_thread(selectors.message_get)(message_id=message_id))
        )

    # -- resuming a pause --

    async def _resume(self) -> CallOutcome:
        message = await in_thread(selectors.message_of_session)(
            session_id=self.session_id, message_id=self.prepared.resume_message_id
        )
        outcome = self.prepared.approval_outcome
        if outcome is not None:
            await self._apply_decision(outcome)
        remaining = await in_thread(selectors.calls_without_result)(message=message)
        # The loop's first step follows: it may store the last result (`_process_calls`).
        return await self._process_calls(
            message, remaining, toolset=await self._toolset(), defer_last=not usage.tokens_priced()
        )

    async def _apply_decision(self, outcome: approvals.ApprovalOutcome) -> None:
        """Run, or refuse, the call an approval was about; its arguments were checked before
        the approval was stored."""
        approval = outcome.approval
        call = wire.StoredToolCall(id=approval.tool_call_id, name=approval.tool_name, arguments="")
        tool = backend_tool(approval.tool_name)
        if outcome.shortfall is not None:
            await self._store_and_report(
                call,
                approval.arguments,
                refusal(outcome.shortfall.for_model, for_user=outcome.shortfall.for_user),
            )
            await self._note(outcome.shortfall.for_user)
        elif not outcome.runs or tool is None:
            await self._store_and_report(
                call, approval.arguments, refusal(approvals.DECLINED_RESULT)
            )
        elif missing := await in_thread(approvals.permission_missing)(
            user=self.prepared.user, tool=tool
        ):
            await self._store_and_report(
                call,
                approval.arguments,
                refusal(missing.for_model, for_user=missing.for_user),
            )
            await self._note(missing.for_user)
        else:
            run = await backend_tool_run(
                tool=tool, arguments=approval.arguments, context=self._tool_context()
            )
            await self._store_and_report(call, approval.arguments, run)

    # -- the loop --

    async def _loop(self) -> None:
        for _ in range(MAX_STEPS):
            if usage.tokens_priced() and not await in_thread(usage.turn_may_continue)(
                user=self.prepared.user
            ):
                await self._note(usage.CREDITS_RAN_OUT)
                return
            step = self._read_ahead() or await in_thread(self._step_inputs)()
            text, calls, usages = await self._ask(
                step.history, step.specs, step.context, stream=True
            )
            stored = await in_thread(self._step_store)(text=text, calls=calls, usages=usages)
            if stored.shown is not None:
                await self.sink.emit(wire.message(stored.shown))
                return
            message = stored.message
            # The turn's next trip (the next step's inputs, or the step limit's message) stores
            # the last call's result, unless a credit check comes first.
            deferrable = not usage.tokens_priced()
            outcome = await self._process_calls(
                message, message.tool_calls, toolset=step.toolset, defer_last=deferrable
            )
            if outcome is CallOutcome.PAUSED:
                return
            work_advance()  # its next step's trips pass the first steps of other turns
        await self._emit_message(await in_thread(self._step_limit_store)())

    def _step_limit_store(self) -> int:
        self._deferred_store()  # the last step's last result first
        return services.message_store(
            session_id=self.session_id,
            turn=self.turn,
            role=Message.Role.ASSISTANT,
            content=STEP_LIMIT_NOTE,
        ).pk

    def _read_ahead(self) -> "_StepInputs | None":
        """The first step's inputs as the preparation read them (`_step_reads_ahead`), once,
        when they were read for what this turn's agent takes (its pictures as image parts or
        not: an agent given at launch, or a server that refused an image meanwhile)."""
        ahead, self.prepared.ahead = self.prepared.ahead, None
        if ahead is None or ahead.images != _accepts_images(self.agent):
            return None
        return ahead

    def _step_inputs(self) -> "_StepInputs":
        """What a step asks the model with, read in one trip to the database thread (each
        trip is a wake-up of that thread and of the loop, the ceiling under load): the claim
        renewed when it was taken or last renewed more than a quarter lease ago, then
        `_step_reads`. The last call's result of the step before is stored first, when it was
        deferred to this trip."""
        self._deferred_store()
        now = time.monotonic()
        if self._lease_stale(now):
            services.session_lease_renew(session_id=self.session_id)
            self.renewed = now
        return _step_reads(session_id=self.session_id, images=_accepts_images(self.agent))

    def _step_store(
        self,
        *,
        text: str,
        calls: list[ToolCallRequest],
        usages: list[Usage],
    ) -> "_StepStored":
        """Store what a step's stream gave, in one trip to the database thread: the model's
        reported usage (free tokens of a step with calls: with the next step's), the
        assistant's message (completing its draft) and, when it has no calls (the turn's
        answer), the message as the page shows it. The window's kept rows know the message
        (`history_rows_stored`)."""
        self._usages_record(usages, hold=bool(calls))
        message = services.message_store(
            session_id=self.session_id,
            turn=self.turn,
            role=Message.Role.ASSISTANT,
            content=text,
            draft_id=self.draft_id,
            tool_calls=services.tool_calls_with_fresh_ids(
                session_id=self.session_id,
                turn=self.turn,
                calls=[
                    wire.StoredToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in calls
                ],
            )
            if calls
            else [],
        )
        history_rows_stored(session_id=self.session_id, messages=[message])
        if not calls:
            return _StepStored(message=message, shown=selectors.message_fresh_serialize(message))
        return _StepStored(message=message, shown=None)

    def _usages_record(self, usages: list[Usage], *, hold: bool = False) -> None:
        """Record the tokens the model reported: priced, each request's at once (the turn is
        charged after each); free, with those held before, as one statement (a step's usage
        was a statement of its own, issue 15), unless `hold` (a step with calls: the turn's
        next step records them, or its end; a crash in between loses free tokens only)."""
        user_id = getattr(self.prepared.user, "pk", None)
        if usage.tokens_priced():
            for reported in usages:
                usage.usage_record(
                    session_id=self.session_id,
                    user_id=user_id,
                    turn=self.turn,
                    prompt_tokens=reported.prompt_tokens,
                    completion_tokens=reported.completion_tokens,
                )
            return
        self.held += usages
        if hold or not self.held:
            return
        held, self.held = self.held, []
        prompt = completion = 0
        for reported in held:  # each request's as `usage_record` counts it
            prompt += max(0, reported.prompt_tokens)
            completion += max(0, reported.completion_tokens)
        usage.usage_record(
            session_id=self.session_id,
            user_id=user_id,
            turn=self.turn,
            prompt_tokens=prompt,
            completion_tokens=completion,
            requests=len(held),
        )

    async def _toolset(self) -> client_tools.ClientToolset | None:
        return await in_thread(selectors.client_toolset_of_session)(session_id=self.session_id)

    async def _ask(
        self,
        history: list[dict[str, Any]],
        specs: list[dict[str, Any]],
        context: AgentContext,
        *,
        stream: bool,
    ) -> tuple[str, list[ToolCallRequest], list[Usage]]:
        """One model request, streamed: its text, its calls and the usage it reported (stored
        by the caller with the step's message; if the stream breaks, held for the turn's end,
        its next trip, which records them: `_held_usages_record`)."""
        draft = _Draft(session_id=self.session_id, turn=self.turn)
        calls: list[ToolCallRequest] = []
        usages: list[Usage] = []
        try:
            async for chunk in self.agent.stream(history=history, tools=specs, context=context):
                if isinstance(chunk, TextDelta):
                    if stream:
                        draft.add(chunk.text)
                        await self.sink.emit(wire.text_delta(chunk.text))
                    else:
                        draft.parts.append(chunk.text)
                elif isinstance(chunk, Thinking):
                    if stream:
                        await self.sink.emit(wire.backend_thinking(chunk.text))
                elif isinstance(chunk, Usage):
                    usages.append(chunk)
                else:
                    calls.append(chunk)
        except BaseException:
            # The model failed, the turn was stopped: what was shown stays, cut off, and what
            # the model reported it used is charged.
            if stream:
                await asyncio.shield(draft.close(cut_off=True))
            self.held += usages  # recorded by the turn's end, its next trip
            raise
        self.draft_id = await draft.close() if stream else None
        text = "".join(draft.parts)
        if stream and calls and text.strip():
            await self.sink.emit(wire.backend_thinking(text.strip()))
        return text, calls, usages

    async def _process_calls(
        self,
        message: Message,
        calls: list[wire.StoredToolCall],
        *,
        toolset: client_tools.ClientToolset | None,
        defer_last: bool = False,
    ) -> CallOutcome:
        """Answer each call in order; a call that must wait pauses the turn here.

        `defer_last`: the turn's next trip is the next step's inputs, so the last call's
        result, if a client tool's, is stored by it (`deferred`) rather than by a trip of its
        own: a served call's round trip then waits for the database thread, where every turn's
        trips queue, once and not twice (issue 15). A backend call's result is stored at once:
        its event follows (engine invariant 5)."""
        for position, call in enumerate(calls, start=1):
            defer = defer_last and position == len(calls)
            if await self._answer_call(message, call, toolset, defer=defer) is CallOutcome.PAUSED:
                await self._emit_message(message.pk)
                return CallOutcome.PAUSED
        return CallOutcome.ANSWERED

    async def _answer_call(
        self,
        message: Message,
        call: wire.StoredToolCall,
        toolset: client_tools.ClientToolset | None,
        *,
        defer: bool = False,
    ) -> CallOutcome:
        """Decode the call's arguments once and hand it to its kind of tool."""
        try:
            arguments = arguments_decode(call.get("arguments"))
        except ValueError as exc:
            return await self._store_and_report(
                call, {}, refusal(f"Invalid arguments for {call['name']}: {exc}.")
            )
        tool = backend_tool(call["name"])
        if tool is not None:
            return await self._backend_call(message, call, tool, arguments)
        if toolset is not None and call["name"] in toolset.tools:
            return await self._client_call(message, call, toolset, arguments, defer=defer)
        return await self._store_and_report(
            call, arguments, refusal(f"There is no tool named {call['name']!r}.")
        )

    async def _store_and_report(
        self,
        call: wire.StoredToolCall,
        arguments: dict[str, Any],
        run: ToolRun,
        *,
        client: client_tools.ClientTool | None = None,
        defer: bool = False,
    ) -> CallOutcome:
        """Store the call's result; a client tool's call keeps its words for the activity
        log (a backend call is reported by its event and words itself from its tool).
        `defer` (a client call's): the turn's next trip stores it (`_process_calls`)."""
        stored = dict(
            session_id=self.session_id,
            turn=self.turn,
            tool_call_id=call["id"],
            tool_name=call["name"],
            content=run.content,
            is_error=not run.ok,
            title=client.title_text if client is not None else "",
            summary=client.summary_of(arguments) if client is not None else "",
        )
        if defer and client is not None:
            self.deferred = stored  # the next step's trip renews the claim if it is stale
        else:
            # One trip: the result, with the claim renewed when it is stale (a long call).
            now = time.monotonic()
            renew = self._lease_stale(now)
            await in_thread(self._result_store)(stored, lease_renew=renew)
            if renew:
                self.renewed = now
        if self.answers is not None:
            self.answers[call["name"]] = self.answers.get(call["name"], 0) + 1
        tool = backend_tool(call["name"])
        if tool is not None:
            await self.sink.emit(
                wire.backend_tool_call(
                    call_id=call["id"],
                    name=call["name"],
                    arguments=arguments,
                    ok=run.ok,
                    error=run.error,
                    title=tool.title,
                    summary=tool.summary_of(arguments),
                    problem=run.problem,
                )
            )
        return CallOutcome.ANSWERED

    async def _backend_call(
        self,
        message: Message,
        call: wire.StoredToolCall,
        tool: BackendTool,
        arguments: dict[str, Any],
    ) -> CallOutcome:
        invalid = await tool.arguments_refusal(arguments)
        if invalid is not None:
            return await self._store_and_report(call, arguments, invalid)
        user = self.prepared.user
        refused = await in_thread(approvals.permission_missing)(
            user=user, tool=tool
        ) or await in_thread(approvals.credits_shortfall)(user=user, tool=tool)
        if refused is not None:
            await self._store_and_report(
                call, arguments, refusal(refused.for_model, for_user=refused.for_user)
            )
            await self._note(refused.for_user)
            return CallOutcome.ANSWERED
        reasons = approvals.approval_reasons(
            tool=tool,
            allow_backend_tools=await in_thread(selectors.session_allows_backend_tools)(
                session_id=self.session_id
            ),
        )
        if reasons:
            await in_thread(approvals.approval_create)(
                session_id=self.session_id,
                message=message,
                tool_call_id=call["id"],
                tool_name=call["name"],
                arguments=arguments,
                reasons=reasons,
                cost=tool.cost_credits,
            )
            return CallOutcome.PAUSED
        run = await backend_tool_run(tool=tool, arguments=arguments, context=self._tool_context())
        return await self._store_and_report(call, arguments, run)

    async def _client_call(
        self,
        message: Message,
        call: wire.StoredToolCall,
        toolset: client_tools.ClientToolset,
        arguments: dict[str, Any],
        *,
        defer: bool = False,
    ) -> CallOutcome:
        tool = toolset.tools[call["name"]]
        await self.sink.emit(
            wire.client_tool_call(
                call_id=call["id"],
                name=tool.name,
                arguments=arguments,
                kind=tool.kind,
                title=tool.title_text,
                summary=tool.summary_of(arguments),
            )
        )
        if self.answers is None:  # read once per turn, then counted here
            # A new message's turn was numbered for it: it has no results yet (no thread hop).
            self.answers = (
                {}
                if self.prepared.resume_message_id is None
                else await in_thread(selectors.tool_answers_in_turn)(
                    session_id=self.session_id, turn=self.turn
                )
            )
        answered = self.answers.get(tool.name, 0)
        if answered >= CLIENT_TOOL_ANSWER_LIMIT:
            return await self._store_and_report(
                call,
                arguments,
                refusal(
                    f"{tool.name} was already answered {answered} times in this turn. Stop calling it and answer with what you have."
                ),
                client=tool,
                defer=defer,
            )
        raw = call.get("arguments")  # its length lets small arguments be checked on the loop
        problem = await tool.arguments_problem(
            arguments, size=len(raw) if isinstance(raw, str) else None
        )
        if problem:
            return await self._store_and_report(
                call,
                arguments,
                refusal(
                    f"Invalid arguments for {tool.name}: {problem}. Nothing was sent to the client."
                ),
                client=tool,
                defer=defer,
            )
        if tool.kind == "one-way":
            return await self._store_and_report(
                call,
                arguments,
                ToolRun(ok=True, content=dict(ONE_WAY_DELIVERED)),
                client=tool,
                defer=defer,
            )
        if not tool.serve:
            await in_thread(approvals.decision_create)(
                session_id=self.session_id,
                message=message,
                tool_call_id=call["id"],
                tool_name=tool.name,
                arguments=arguments,
                result_schema=tool.result or {},
                title=tool.title_text,
                summary=tool.summary_of(arguments),
            )
            return CallOutcome.PAUSED
        answer = await client_tools.client_tool_request(
            channel_name=toolset.channel_name,
            tool=tool,
            arguments=arguments,
            timeout=settings.GEOSENSE_CLIENT_TOOL_TIMEOUT,
            elsewhere=toolset.elsewhere,
            reachable=self._reachable(toolset),
        )
        content = (
            answer.result
            if answer.ok and answer.result is not None
            else {"error": answer.error or "no answer"}
        )
        return await self._store_and_report(
            call,
            arguments,
            ToolRun(ok=answer.ok, content=content),
            client=tool,
            defer=defer,
        )

    def _reachable(self, toolset: client_tools.ClientToolset) -> Callable | None:
        """For a socket of another process: whether that process still heartbeats, asked
        while its answer is awaited (a killed process's socket is not waited for)."""
        if not toolset.elsewhere or toolset.process is None or not processes.heartbeats_on():
            return None

        async def reachable() -> bool:
            return await in_thread(processes.process_alive)(process_id=toolset.process)

        return reachable

    # -- tools' context and sub-turns --

    def _tool_context(self) -> ToolContext:
        session_id = self.session_id

        def save(*, kind: str, data: Any, origin: str) -> str:
            return services.artifact_save(
                session_id=session_id, kind=kind, data=data, origin=origin
            )

        return ToolContext(artifact_save=save, subturn=self._subturn)

    async def _subturn(self, *, instructions: str, tool_names: frozenset[str]) -> str:
        """A sub-turn in memory: read-only backend tools only, never client tools or approvals."""
        tools = [
            t
            for t in backend_tools()
            if t.name in tool_names and t.read_only and not t.destructive and not t.cost_credits
        ]
        by_name = {t.name: t for t in tools}
        overview = await in_thread(annotation_overview)()
        prompt = system_prompt(overview=overview.counts, shapes=overview.shapes)
        history: list[dict[str, Any]] = [
            {"role": "system", "content": prompt},
            {"role": "user", "content": instructions},
        ]
        context = AgentContext(
            overview=overview.counts, shapes=overview.shapes, request=UserRequest(text=instructions)
        )
        specs = [t.openai_spec() for t in tools]
        for _ in range(SUBTURN_MAX_STEPS):
            text, calls, usages = await self._ask(history, specs, context, stream=False)
            if usages:
                await in_thread(self._usages_record)(usages)
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
                run = await self._subturn_call(call, by_name.get(call.name))
                history.append(
                    {"role": "tool", "tool_call_id": call.id, "content": _json_text(run.content)}
                )
        return "The helper agent did not finish within its step limit."

    async def _subturn_call(self, call: ToolCallRequest, tool: BackendTool | None) -> ToolRun:
        if tool is None:
            return refusal(f"{call.name} is not available to a sub-agent.")
        try:
            arguments = arguments_decode(call.arguments)
        except ValueError as exc:
            return refusal(str(exc))
        invalid = await tool.arguments_refusal(arguments)
        if invalid is not None:
            return invalid
        return await backend_tool_run(tool=tool, arguments=arguments, context=self._tool_context())


def _step_reads(*, session_id: Any, images: bool) -> _StepInputs:
    """A step's reads: the session's client tools, the system prompt and the newest turns that
    fit the model's context (chat/history.py; the newest pictures as image parts if
    `images`), with the request they answer."""
    toolset, client_specs, revision = selectors.client_tools_and_revision(session_id=session_id)
    specs = backend_tool_specs() + client_specs  # each made once, not at every step
    overview = annotation_overview(revision=revision)
    prompt = _system_prompt_of(overview)
    window = history_window(
        session_id=session_id, budget=history_budget(system=prompt, tools=specs), images=images
    )
    request = (
        selectors.user_request_of(text=window.latest_user[0], contexts=window.latest_user[1])
        if window.latest_user is not None
        else selectors.user_request_latest(session_id=session_id)
    )
    if window.left_out:
        prompt = f"{prompt}\n\n{LEFT_OUT_NOTE}"
    return _StepInputs(
        toolset=toolset,
        specs=list(specs.specs),
        history=[{"role": "system", "content": prompt}, *window.messages],
        context=AgentContext(overview=overview.counts, shapes=overview.shapes, request=request),
        images=images,
    )


# The system prompt of the overview last asked: `annotation_overview` gives the same object
# while the index's revision holds, so a step's prompt (the overview's JSON and ~3 KB of
# guide and rules joined) is made once per revision, not at every step of every turn.
_prompt_kept: tuple[DatasetOverview, str] | None = None


def _system_prompt_of(overview: DatasetOverview) -> str:
    global _prompt_kept
    kept = _prompt_kept
    if kept is not None and kept[0] is overview:
        return kept[1]
    prompt = system_prompt(overview=overview.counts, shapes=overview.shapes)
    _prompt_kept = (overview, prompt)
    return prompt


def _json_text(content: dict[str, Any]) -> str:
    return json.dumps(content, ensure_ascii=False)
