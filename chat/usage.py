"""Model tokens per turn and what they cost: recorded when the server reports them, charged
through the credit ledger (geosense/accounts/services.py) at GEOSENSE_CREDITS_PER_1K_TOKENS.

The price is per 1,000 tokens (prompt and completion alike). A turn is charged for its running
total, rounded up to whole credits, after each request that reports usage; a charge never takes
the balance below zero (the tokens are spent already), and a turn whose balance runs out stops
before its next request. A new message is refused before it is stored when the balance cannot
pay for 1,000 tokens (at least 1 credit).
"""

import math
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.dispatch import receiver
from django.utils import timezone

from geosense.accounts.services import credit_balance, credit_charge
from geosense.compiled import FETCH_ONE, db_value, model_made, qmark_form, time_param, write_run
from geosense.dbpool import trip_connections

from .models import ChatSession, TurnUsage

LEDGER_NAME = "model tokens"  # the ledger's `tool_name` of a token charge


class TurnUnaffordable(Exception):
    """The balance cannot start a turn; the message is a sentence for the person."""


# The price, read from the settings at its first use and kept: read through Django's lazy
# settings object (two Python calls a setting) by every step and every usage record, it cost
# ~6 Python calls a turn on the event loop and the database thread (issue 15). A setting changed
# (tests, `override_settings`) drops it.
_price_kept: float | None = None


def _price() -> float:
    """Credits per 1,000 tokens; the local agent uses no model, so it is free."""
    global _price_kept
    if _price_kept is None:
        _price_kept = (
            settings.GEOSENSE_CREDITS_PER_1K_TOKENS if settings.GEOSENSE_AGENT == "openai" else 0.0
        )
    return _price_kept


@receiver(setting_changed)
def _price_forget(*, setting: str, **kwargs) -> None:
    global _price_kept
    if setting in ("GEOSENSE_AGENT", "GEOSENSE_CREDITS_PER_1K_TOKENS"):
        _price_kept = None


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
    requests: int = 1,
) -> TurnUsage:
    """Add one request's reported tokens to its turn and charge what the turn owes now.
    `user_id`: the session's owner, when the caller knows it (not read again). `requests`:
    the requests these tokens are the sum of (free tokens only: a priced turn is charged after
    each request).

    The turn's row is added to in one statement (`_usage_add`); only a priced turn then reads
    the balance and charges, in the same transaction."""
    if not tokens_priced():
        return _usage_add(session_id, turn, prompt_tokens, completion_tokens, user_id, requests)
    with transaction.atomic():
        usage = _usage_add(session_id, turn, prompt_tokens, completion_tokens, user_id)
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
                TurnUsage.objects.filter(pk=usage.pk).update(credits=usage.credits)
    return usage


def _usage_add(
    session_id: object,
    turn: int,
    prompt_tokens: int,
    completion_tokens: int,
    user_id: Any,
    requests: int = 1,
) -> TurnUsage:
    """The turn's row with one more request and its tokens, inserted or added to in one
    statement, an upsert returning the totals: every model step records its usage, and the
    locked read, the write and the transaction around them were a quarter of the database
    thread's work per turn (issue 15). An SQLite older than 3.35 (no `RETURNING`) goes
    through the ORM."""
    connection = trip_connections.default or connections[DEFAULT_DB_ALIAS]
    prompt_tokens, completion_tokens = max(0, prompt_tokens), max(0, completion_tokens)
    if not connection.features.can_return_columns_from_insert:
        return _usage_add_orm(session_id, turn, prompt_tokens, completion_tokens, user_id, requests)
    now = time_param(timezone.now(), connection)
    session_pk = db_value(TurnUsage, "session", session_id, connection)
    sql, qmark = _upsert_sql(connection)
    params = [session_pk, user_id, session_pk, turn, requests, prompt_tokens, completion_tokens]
    params += [now, now]
    row = write_run(connection, sql, qmark, params, FETCH_ONE)
    pk, user_id, requests, prompt, completion, credits = row
    values = {
        "id": pk,
        "session_id": session_id,
        "user_id": user_id,
        "turn": turn,
        "requests": requests,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "credits": credits,
    }
    # Made from its values in its fields' order, as the ORM makes what it reads (from keywords,
    # each field left out is looked up and defaulted: ~20 Python calls every step).
    usage = model_made(TurnUsage, [values.get(name) for name in _USAGE_FIELDS])
    usage._state.adding, usage._state.db = False, connection.alias
    return usage


_USAGE_FIELDS = [field.attname for field in TurnUsage._meta.concrete_fields]


def _upsert_sql(connection: Any) -> tuple[str, str | None]:
    """`INSERT … ON CONFLICT (session, turn) DO UPDATE … RETURNING`, as SQLite (3.35+) and
    PostgreSQL both read it, with its SQLite form (`geosense.compiled.statement_run`);
    built once per database vendor."""
    found = _UPSERT.get(connection.vendor)
    if found is None:
        sql = _upsert_sql_build(connection.ops.quote_name)
        found = _UPSERT[connection.vendor] = (sql, qmark_form(connection, sql))
    return found


_UPSERT: dict[str, tuple[str, str | None]] = {}


def _upsert_sql_build(q: Callable[[str], str]) -> str:
    table = q(TurnUsage._meta.db_table)
    column = {f.name: q(f.column) for f in TurnUsage._meta.concrete_fields}
    sessions, owner = q(ChatSession._meta.db_table), q(ChatSession._meta.get_field("user").column)
    added = ", ".join(
        f"{column[name]} = {table}.{column[name]} + excluded.{column[name]}"
        for name in ("requests", "prompt_tokens", "completion_tokens")
    )
    return (
        f"INSERT INTO {table} ({column['session']}, {column['user']}, {column['turn']}, "
        f"{column['requests']}, {column['prompt_tokens']}, {column['completion_tokens']}, "
        f"{column['credits']}, {column['created']}, {column['updated']}) "
        f"VALUES (%s, COALESCE(%s, (SELECT {owner} FROM {sessions} WHERE "
        f"{q(ChatSession._meta.pk.column)} = %s)), %s, %s, %s, %s, 0, %s, %s) "
        f"ON CONFLICT ({column['session']}, {column['turn']}) DO UPDATE SET {added}, "
        f"{column['updated']} = excluded.{column['updated']} "
        f"RETURNING {column['id']}, {column['user']}, {column['requests']}, "
        f"{column['prompt_tokens']}, {column['completion_tokens']}, {column['credits']}"
    )


def _usage_add_orm(
    session_id: object,
    turn: int,
    prompt_tokens: int,
    completion_tokens: int,
    user_id: Any,
    requests: int,
) -> TurnUsage:
    with transaction.atomic():
        usage = (
            TurnUsage.objects.select_for_update().filter(session_id=session_id, turn=turn).first()
        )
        if usage is None:
            if user_id is None:
                user_id = ChatSession.objects.values_list("user_id", flat=True).get(pk=session_id)
            usage = TurnUsage(session_id=session_id, user_id=user_id, turn=turn)
        usage.requests += requests
        usage.prompt_tokens += prompt_tokens
        usage.completion_tokens += completion_tokens
        usage.save()
    return usage


CREDITS_RAN_OUT = (
    "Your credits ran out while the assistant was answering, so it stopped here. "
    "Add credits to continue."
)
