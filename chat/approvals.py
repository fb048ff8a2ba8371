"""When a backend tool call waits for the user, and how a decision is taken once."""

from dataclasses import dataclass
from typing import Literal

from django.db import transaction
from django.utils import timezone

from geosense.accounts.services import InsufficientCredits, credit_balance, credit_charge
from tools.registry import BackendTool

from .models import Approval, ChatSession
from .services import tool_result_store

Reason = Literal["backend_access", "credits", "destructive"]

DECLINED_RESULT = (
    "The user declined this call; it did not run. Do not call it again unless the user asks."
)
Decision = Literal["approve", "reject"]


def approval_reasons(*, tool: BackendTool, allow_backend_tools: bool) -> list[Reason]:
    """Why this call must wait: empty when it may run at once.

    Backend access is asked for until the user grants it (approving such a request turns the
    session's `allow_backend_tools` on); calls that cost credits or delete something always ask.
    """
    reasons: list[Reason] = []
    if not allow_backend_tools:
        reasons.append("backend_access")
    if tool.cost_credits > 0:
        reasons.append("credits")
    if tool.destructive:
        reasons.append("destructive")
    return reasons


class ApprovalConflict(Exception):
    """The approval cannot be decided (unknown, not pending, not the latest): a 4xx."""

    def __init__(self, message: str, *, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class DecisionOutcome:
    approval: Approval
    # Set when approving failed to charge: the call is refused.
    shortfall: "CreditShortfall | None" = None


def approval_check(*, session_id: object, approval_id: int) -> Approval:
    """The session's latest pending approval with this id, or ApprovalConflict."""
    approval = Approval.objects.filter(pk=approval_id, session_id=session_id).first()
    if approval is None:
        raise ApprovalConflict("unknown approval", status=404)
    if approval.status != Approval.Status.PENDING:
        raise ApprovalConflict(f"approval already {approval.status.replace('_', ' ')}")
    latest = (
        Approval.objects.filter(session_id=session_id)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    if latest != approval.pk:
        raise ApprovalConflict("not the session's latest approval")
    return approval


def approval_decide(
    *, session_id: object, approval_id: int, decision: Decision, user
) -> DecisionOutcome:
    """Take the decision exactly once; approving charges the credits in the same transaction.

    The conditional update is the lock: of many concurrent requests, only the one that moved
    the row from `pending` gets an outcome, every other one gets ApprovalConflict.
    """
    status = Approval.Status.APPROVED if decision == "approve" else Approval.Status.REJECTED
    with transaction.atomic():
        changed = Approval.objects.filter(
            pk=approval_id, session_id=session_id, status=Approval.Status.PENDING
        ).update(status=status, decided_by=user, decided_at=timezone.now())
        if not changed:
            raise ApprovalConflict("approval already decided")
        approval = Approval.objects.select_related("session", "message").get(pk=approval_id)
        shortfall = None
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
        if status == Approval.Status.APPROVED:
            if "backend_access" in approval.reasons:
                ChatSession.objects.filter(pk=session_id).update(allow_backend_tools=True)
            if approval.cost_credits:
                try:
                    credit_charge(
                        user=approval.session.user,
                        amount=approval.cost_credits,
                        tool_call_id=approval.tool_call_id,
                        tool_name=approval.tool_name,
                        session_id=str(session_id),
                    )
                except InsufficientCredits as exc:
                    shortfall = CreditShortfall(
                        tool=approval.tool_name, cost=exc.needed, balance=exc.balance
                    )
    return DecisionOutcome(approval=approval, shortfall=shortfall)


@dataclass(frozen=True)
class CreditShortfall:
    """A call the balance cannot cover: one sentence for the user, one for the model."""

    tool: str
    cost: int
    balance: int

    @property
    def for_user(self) -> str:
        return f"Not enough credits: {self.tool} costs {self.cost} credits and the balance is {self.balance}."

    @property
    def for_model(self) -> str:
        return f"Refused before running. {self.for_user} Tell the user they do not have enough credits."


def credits_shortfall(*, user, tool: BackendTool) -> CreditShortfall | None:
    """Checked before asking for approval, so nobody approves a call that cannot run."""
    if tool.cost_credits <= 0:
        return None
    balance = credit_balance(user=user)
    if balance >= tool.cost_credits:
        return None
    return CreditShortfall(tool=tool.name, cost=tool.cost_credits, balance=balance)
