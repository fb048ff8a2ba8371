"""Pauses: when a call waits for the user, and how each pause is decided exactly once.

A turn pauses on a row (docs/architecture.md, "Engine invariants" 3 and 4): an `Approval` for a
backend call that needs the user's consent, a `PendingDecision` for a blocking client-tool call
the reader answers. Both leave `pending` exactly once, by a conditional update: of many
concurrent requests only the one that moved the row goes on; every other one gets
`PauseConflict`. The call's result, when the decision settles it, is written in the same
transaction (invariant 1).

The errors here say what went wrong in domain terms; `chat/api.py` maps them to HTTP statuses.
"""

from dataclasses import dataclass
from typing import Any, Literal

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from geosense.accounts.services import InsufficientCredits, credit_balance, credit_charge
from geosense.compiled import CompiledRead, db_value
from geosense.wire import ApprovalReason
from tools.registry import BackendTool, backend_tool
from tools.schemas import validation_problem

from .models import Approval, ChatSession, Message, PendingDecision
from .services import tool_result_store

DECLINED_RESULT = (
    "The user declined this call; it did not run. Do not call it again unless the user asks."
)
SET_ASIDE_RESULT = (
    "Not run: the user sent a new message instead of answering, so this call was set aside."
)
Decision = Literal["approve", "reject"]


class PauseNotFound(LookupError):
    """No pause of the session names this approval or tool call."""


class PauseConflict(Exception):
    """The pause was already decided (or is not the one the session waits on)."""


class AnswerInvalid(ValueError):
    """The reader's answer does not match the tool's result schema."""


# --- when a backend call waits ---------------------------------------------------------------


def approval_reasons(*, tool: BackendTool, allow_backend_tools: bool) -> list[ApprovalReason]:
    """Why this call must wait: empty when it may run at once.

    Backend access is asked for until the user grants it (approving such a request turns the
    session's `allow_backend_tools` on); calls that cost credits or delete something always ask.
    """
    reasons: list[ApprovalReason] = []
    if not allow_backend_tools:
        reasons.append("backend_access")
    if tool.cost_credits > 0:
        reasons.append("credits")
    if tool.destructive:
        reasons.append("destructive")
    return reasons


@dataclass(frozen=True)
class CreditShortfall:
    """A call the balance cannot cover: one sentence for the user, one for the model."""

    tool: str
    cost: int
    balance: int

    @property
    def for_user(self) -> str:
        tool = backend_tool(self.tool)
        what = f"“{tool.title}”" if tool is not None else "this"
        return (
            f"Not enough credits for {what}: it costs {_credits(self.cost)} and you have "
            f"{_credits(self.balance)}."
        )

    @property
    def for_model(self) -> str:
        return (
            f"Refused before running. Not enough credits: {self.tool} costs {self.cost} credits "
            f"and the balance is {self.balance}. Tell the user they do not have enough credits."
        )


def _credits(n: int) -> str:
    return f"{n:,} credit{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class PermissionMissing:
    """A call the user may not make at all: refused before any approval card is shown."""

    tool: str
    permission: str

    @property
    def for_user(self) -> str:
        tool = backend_tool(self.tool)
        what = f"“{tool.title}”" if tool is not None else "this"
        return (
            f"You may not use {what}: the annotations are shared by every user, and only "
            "their curators may change them. An administrator can make you one."
        )

    @property
    def for_model(self) -> str:
        return (
            f"Refused before running. You may not run {self.tool}: the annotations are shared "
            f"by every user, and only their curators (the {self.permission} permission) may "
            "change them. Tell the user an administrator can grant that permission; do not "
            "call it again."
        )


def permission_missing(*, user, tool: BackendTool) -> PermissionMissing | None:
    """Checked before asking for approval and again before an approved call runs."""
    if not tool.permission or user.has_perm(tool.permission):
        return None
    return PermissionMissing(tool=tool.name, permission=tool.permission)


def credits_shortfall(*, user, tool: BackendTool) -> CreditShortfall | None:
    """Checked before asking for approval, so nobody approves a call that cannot run."""
    if tool.cost_credits <= 0:
        return None
    balance = credit_balance(user=user)
    if balance >= tool.cost_credits:
        return None
    return CreditShortfall(tool=tool.name, cost=tool.cost_credits, balance=balance)


# --- pausing ---------------------------------------------------------------------------------


def approval_create(
    *,
    session_id: object,
    message: Message,
    tool_call_id: str,
    tool_name: str,
    arguments: dict[str, Any],
    reasons: list[ApprovalReason],
    cost: int,
) -> Approval:
    return Approval.objects.create(
        session_id=session_id,
        message=message,
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        arguments=arguments,
        reasons=reasons,
        cost_credits=cost,
    )


def decision_create(
    *,
    session_id: object,
    message: Message,
    tool_call_id: str,
    tool_name: str,
    arguments: dict[str, Any],
    result_schema: dict[str, Any],
    title: str = "",
    summary: str = "",
) -> PendingDecision:
    return PendingDecision.objects.create(
        session_id=session_id,
        message=message,
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        arguments=arguments,
        result_schema=result_schema,
        title=title[: PendingDecision.TITLE_MAX_CHARS],
        summary=summary[: PendingDecision.SUMMARY_MAX_CHARS],
    )


def pauses_set_aside(*, session_id: object) -> int:
    """A new user message sets every open pause aside; each paused call gets its result.
    Usually there is none: two reads compiled once per process say so, and no write
    transaction begins (the caller holds the claim, so no pause appears meanwhile)."""
    if not any(read.rows(session_id) for read in _PENDING):
        return 0
    count = 0
    now = timezone.now()
    with transaction.atomic():
        for model in (Approval, PendingDecision):
            pending = model.Status.PENDING
            for pause in model.objects.filter(session_id=session_id, status=pending).select_related(
                "message"
            ):
                if model.objects.filter(pk=pause.pk, status=pending).update(
                    status=model.Status.SET_ASIDE, decided_at=now
                ):
                    tool_result_store(
                        session_id=session_id,
                        turn=pause.message.turn,
                        tool_call_id=pause.tool_call_id,
                        tool_name=pause.tool_name,
                        content={"error": SET_ASIDE_RESULT},
                        is_error=True,
                    )
                    count += 1
    return count


def _pending_read(model: Any) -> CompiledRead:
    def build(session_id: object) -> QuerySet:
        return model.objects.filter(session_id=session_id, status=model.Status.PENDING).values_list(
            "pk"
        )[:1]

    def tail(connection: Any, session_id: object) -> list[Any]:
        return [db_value(model, "session", session_id, connection), model.Status.PENDING]

    return CompiledRead(build=build, tail=tail)


# Whether the session has an open approval, an open decision (every new message asks).
_PENDING = (_pending_read(Approval), _pending_read(PendingDecision))


# --- deciding once ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ApprovalOutcome:
    """A decided approval; `shortfall` is set when approving failed to charge (the call is
    then refused)."""

    approval: Approval
    shortfall: CreditShortfall | None = None

    @property
    def runs(self) -> bool:
        return self.approval.status == Approval.Status.APPROVED and self.shortfall is None


def _status_words(status: str) -> str:
    return status.replace("_", " ")


def approval_decide(
    *, session_id: object, approval_id: int, decision: Decision, user
) -> ApprovalOutcome:
    """Take the decision exactly once; approving charges the credits in the same transaction.

    Only the session's latest pending approval can be decided: an older one is stale.
    """
    approval = Approval.objects.filter(pk=approval_id, session_id=session_id).first()
    if approval is None:
        raise PauseNotFound("unknown approval")
    if approval.status != Approval.Status.PENDING:
        raise PauseConflict(f"approval already {_status_words(approval.status)}")
    latest = (
        Approval.objects.filter(session_id=session_id)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    if latest != approval.pk:
        raise PauseConflict("not the session's latest approval")
    status = Approval.Status.APPROVED if decision == "approve" else Approval.Status.REJECTED
    with transaction.atomic():
        changed = Approval.objects.filter(
            pk=approval_id, session_id=session_id, status=Approval.Status.PENDING
        ).update(status=status, decided_by=user, decided_at=timezone.now())
        if not changed:
            raise PauseConflict("approval already decided")
        approval = Approval.objects.select_related("session", "message").get(pk=approval_id)
        if status == Approval.Status.REJECTED:
            # The call's wait ends here, so its result is written in the same transaction.
            tool_result_store(
                session_id=session_id,
                turn=approval.message.turn,
                tool_call_id=approval.tool_call_id,
                tool_name=approval.tool_name,
                content={"error": DECLINED_RESULT},
                is_error=True,
            )
            return ApprovalOutcome(approval=approval)
        if "backend_access" in approval.reasons:
            ChatSession.objects.filter(pk=session_id).update(allow_backend_tools=True)
        return ApprovalOutcome(approval=approval, shortfall=_charge(approval, session_id))


def _charge(approval: Approval, session_id: object) -> CreditShortfall | None:
    if not approval.cost_credits:
        return None
    try:
        credit_charge(
            user=approval.session.user,
            amount=approval.cost_credits,
            session_id=str(approval.session_id),
            tool_call_id=approval.tool_call_id,
            tool_name=approval.tool_name,
        )
    except InsufficientCredits as exc:
        return CreditShortfall(tool=approval.tool_name, cost=exc.needed, balance=exc.balance)
    return None


async def decision_answer_check(
    *, session_id: object, tool_call_id: str, result: dict[str, Any]
) -> None:
    """Check the reader's answer against the result schema the tool declared when it was
    called; raises AnswerInvalid. The schema and the answer are the browser's: the check runs
    in the schema worker with its budget, never on the event loop or the thread of the ORM.
    An unknown or decided call passes here and is refused by `decision_answer`."""
    decision = await PendingDecision.objects.filter(
        session_id=session_id, tool_call_id=tool_call_id, status=PendingDecision.Status.PENDING
    ).afirst()
    if decision is None:
        return
    problem = await validation_problem(schema=decision.result_schema or {}, value=result)
    if problem:
        raise AnswerInvalid(
            f"the result does not match {decision.tool_name}'s result schema: {problem}"
        )


def decision_answer(
    *, session_id: object, tool_call_id: str, result: dict[str, Any]
) -> PendingDecision:
    """Take the reader's answer exactly once and store it as the call's result.

    The caller has checked the answer with `decision_answer_check` first.
    """
    decision = (
        PendingDecision.objects.filter(session_id=session_id, tool_call_id=tool_call_id)
        .select_related("message")
        .first()
    )
    if decision is None:
        raise PauseNotFound("unknown tool call")
    if decision.status != PendingDecision.Status.PENDING:
        raise PauseConflict(f"tool call already {_status_words(decision.status)}")
    with transaction.atomic():
        changed = PendingDecision.objects.filter(
            pk=decision.pk, status=PendingDecision.Status.PENDING
        ).update(status=PendingDecision.Status.ANSWERED, decided_at=timezone.now())
        if not changed:
            raise PauseConflict("tool call already answered")
        tool_result_store(
            session_id=session_id,
            turn=decision.message.turn,
            tool_call_id=decision.tool_call_id,
            tool_name=decision.tool_name,
            content=result,
        )
    return decision
