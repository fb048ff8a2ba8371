"""Model tokens per turn and what they cost: recorded when the server reports them, charged
through the credit ledger (geosense/accounts/services.py) at GEOSENSE_CREDITS_PER_1K_TOKENS.

The price is per 1,000 tokens (prompt and completion alike). A turn is charged for its running
total, rounded up to whole credits, after each request that reports usage; a charge never takes
the balance below zero (the tokens are spent already), and a turn whose balance runs out stops
before its next request. A new message is refused before it is stored when the balance cannot
pay for 1,000 tokens (at least 1 credit).
"""

import math

from django.conf import settings
from django.db import transaction

from geosense.accounts.services import credit_balance, credit_charge

from .models import ChatSession, TurnUsage

LEDGER_NAME = "model tokens"  # the ledger's `tool_name` of a token charge


class TurnUnaffordable(Exception):
    """The balance cannot start a turn; the message is a sentence for the person."""


def _price() -> float:
    """Credits per 1,000 tokens; the local agent uses no model, so it is free."""
    if settings.GEOSENSE_AGENT != "openai":
        return 0.0
    return settings.GEOSENSE_CREDITS_PER_1K_TOKENS


def turn_minimum_credits() -> int:
    """What a new turn needs on the balance: the price of 1,000 tokens, at least 1 (0: free)."""
    price = _price()
    return max(1, math.ceil(price)) if price > 0 else 0


def turn_affordable_check(*, user) -> None:
    """Raise `TurnUnaffordable` when the user's balance cannot start a turn."""
    needed = turn_minimum_credits()
    if not needed:
        return
    balance = credit_balance(user=user)
    if balance < needed:
        price = f"{_price():g}"
        raise TurnUnaffordable(
            f"your balance of {balance} credit{'' if balance == 1 else 's'} cannot start an "
            f"answer: the assistant costs {price} credit{'' if price == '1' else 's'} per "
            f"1,000 tokens and an answer needs at least {needed} on the balance"
        )


def tokens_priced() -> bool:
    return _price() > 0


def turn_may_continue(*, user) -> bool:
    """Whether a running turn may make another request (its balance is not spent)."""
    return not tokens_priced() or credit_balance(user=user) > 0


def usage_record(
    *,
    session_id: object,
    turn: int,
    prompt_tokens: int,
    completion_tokens: int,
    user_id: int | None = None,
) -> TurnUsage:
    """Add one request's reported tokens to its turn and charge what the turn owes now.
    `user_id`: the session's owner, when the caller knows it (not read again). A turn's first
    request inserts its row with the counts (one write)."""
    with transaction.atomic():
        usage = (
            TurnUsage.objects.select_for_update().filter(session_id=session_id, turn=turn).first()
        )
        if usage is None:
            if user_id is None:
                user_id = ChatSession.objects.values_list("user_id", flat=True).get(pk=session_id)
            usage = TurnUsage(session_id=session_id, user_id=user_id, turn=turn)
        usage.requests += 1
        usage.prompt_tokens += max(0, prompt_tokens)
        usage.completion_tokens += max(0, completion_tokens)
        owed = math.ceil((usage.prompt_tokens + usage.completion_tokens) * _price() / 1000)
        due = owed - usage.credits
        if due > 0:
            user = usage.user
            amount = min(due, credit_balance(user=user))
            if amount > 0:
                credit_charge(
                    user=user,
                    amount=amount,
                    session_id=str(session_id),
                    tool_call_id=f"tokens:turn-{turn}:request-{usage.requests}",
                    tool_name=LEDGER_NAME,
                )
                usage.credits += amount
        usage.save()
    return usage


CREDITS_RAN_OUT = (
    "Your credits ran out while the assistant was answering, so it stopped here. "
    "Add credits to continue."
)
