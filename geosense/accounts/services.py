"""Token and credit services: the only code that writes tokens, balances and the ledger."""

import hashlib
import logging
import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Permission
from django.db import IntegrityError, OperationalError, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from geosense.compiled import CompiledRead, model_columns, model_from_row

from .models import ApiToken, CreditAccount, CreditCharge

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "gs_"
DEMO_USERNAME = "demo"
DEMO_PASSWORD = "demo"
DEMO_CREDITS = 100


class InsufficientCredits(Exception):
    def __init__(self, *, needed: int, balance: int) -> None:
        super().__init__(f"This needs {needed} credits and the balance is {balance}.")
        self.needed = needed
        self.balance = balance


def token_digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


TOKEN_DAYS_DEFAULT = 90


def api_token_create(*, user: AbstractBaseUser, days: int = TOKEN_DAYS_DEFAULT) -> str:
    """Create a token valid for `days` and return it in clear; this is the only time it is
    ever seen."""
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    ApiToken.objects.create(
        user=user,
        digest=token_digest(raw),
        prefix=raw[:8],
        expires=timezone.now() + timedelta(days=days),
    )
    return raw


LAST_USED_PRECISION = timedelta(minutes=1)


def _token_with_user_query(digest: str) -> QuerySet:
    user = get_user_model()
    columns = [*model_columns(ApiToken), *model_columns(user, through="user__")]
    return ApiToken.objects.filter(digest=digest).order_by("pk").values_list(*columns)[:1]


# Every API request and socket reads its token with its user: compiled once per process
# (geosense/compiled.py; through the ORM, ~400 µs of the requests' pool a request, ~35 µs).
_TOKEN_WITH_USER = CompiledRead(
    build=_token_with_user_query, tail=lambda connection, digest: [digest]
)


def _token_with_user(digest: str) -> ApiToken | None:
    rows = _TOKEN_WITH_USER.rows(digest)
    if not rows:
        return None
    split = len(ApiToken._meta.concrete_fields)
    token = model_from_row(ApiToken, rows[0][:split])
    token.user = model_from_row(get_user_model(), rows[0][split:])
    return token


def api_token_authenticate(*, raw: str) -> ApiToken | None:
    """The live token of an active user that `raw` is, with its user; None otherwise.

    `last_used` is written at most once a minute: a write per request would make every API
    call contend for the database's write lock. It is bookkeeping: when the database cannot
    take the write now (locked), the request goes on and a later one writes it.
    """
    token = _token_with_user(token_digest(raw))
    now = timezone.now()
    if token is None or not token.user.is_active or token.expires <= now:
        return None
    if token.last_used is None or now - token.last_used > LAST_USED_PRECISION:
        try:
            ApiToken.objects.filter(pk=token.pk).update(last_used=now)
        except OperationalError as exc:
            logger.info("token %s: last_used not written now (%s)", token.prefix, exc)
    return token


def api_token_user(*, raw: str) -> AbstractBaseUser | None:
    """The active user a live raw token belongs to, or None."""
    token = api_token_authenticate(raw=raw)
    return token.user if token else None


def api_tokens_of_user(*, user: AbstractBaseUser) -> list[ApiToken]:
    return list(ApiToken.objects.filter(user=user).order_by("-created"))


def api_token_revoke(*, user: AbstractBaseUser, token_id: int) -> bool:
    """Revoke one of the user's own tokens; its sockets close (signals.py). False: no such
    token of this user."""
    deleted, _ = ApiToken.objects.filter(pk=token_id, user=user).delete()
    return bool(deleted)


def api_token_serialize(token: ApiToken) -> dict[str, object]:
    return {
        "id": token.pk,
        "prefix": token.prefix,
        "created": token.created.isoformat(),
        "last_used": token.last_used.isoformat() if token.last_used else None,
        "expires": token.expires.isoformat(),
        "expired": token.expires <= timezone.now(),
    }


def credit_balance(*, user: AbstractBaseUser) -> int:
    account = CreditAccount.objects.filter(user=user).first()
    return account.balance if account else 0


def credit_set(*, user: AbstractBaseUser, balance: int) -> CreditAccount:
    account, _ = CreditAccount.objects.update_or_create(user=user, defaults={"balance": balance})
    return account


def credit_charge(
    *, user: AbstractBaseUser, amount: int, session_id: str, tool_call_id: str, tool_name: str
) -> int:
    """Charge a stored tool call once; returns the new balance.

    The call is named by its session and its id there: the model's id alone repeats across
    sessions. Must run inside the caller's transaction (the one that decides the approval), so
    that a decision and its charge land together. The conditional update never lets the
    balance go below zero, and the ledger's unique (session, call) makes a second charge of one
    call impossible: a concurrent second charge rolls back whole, balance included.
    """
    if amount <= 0:
        return credit_balance(user=user)
    key = {"session_id": str(session_id), "tool_call_id": tool_call_id}
    try:
        with transaction.atomic():
            if CreditCharge.objects.filter(**key).exists():
                return credit_balance(user=user)
            updated = CreditAccount.objects.filter(user=user, balance__gte=amount).update(
                balance=F("balance") - amount
            )
            if not updated:
                raise InsufficientCredits(needed=amount, balance=credit_balance(user=user))
            CreditCharge.objects.create(user=user, amount=amount, tool_name=tool_name, **key)
    except IntegrityError:
        pass  # charged meanwhile by a concurrent request; this one changed nothing
    return credit_balance(user=user)


def local_superuser_ensure(*, username: str, password: str) -> bool:
    """Make `username` an active superuser whose password is `password`; True if created.

    For `make run` only (the caller checks DEBUG): the login printed beside demo/demo must
    work, so a changed password or a lost staff flag is set back to what `.env` says.
    """
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(**{user_model.USERNAME_FIELD: username})
    if not (user.is_active and user.is_staff and user.is_superuser):
        user.is_active = user.is_staff = user.is_superuser = True
        user.save(update_fields=["is_active", "is_staff", "is_superuser"])
    if created or not user.check_password(password):
        user.set_password(password)
        user.save(update_fields=["password"])
    return created


def demo_user_ensure() -> bool:
    """Create demo/demo with its credits if missing; an existing user is left as it is.

    Returns whether the user was created.
    """
    user_model = get_user_model()
    user = user_model.objects.filter(username=DEMO_USERNAME).first()
    created = user is None
    if user is None:
        user = user_model.objects.create_user(username=DEMO_USERNAME, password=DEMO_PASSWORD)
    if not CreditAccount.objects.filter(user=user).exists():
        credit_set(user=user, balance=DEMO_CREDITS)
    # demo curates the demo dataset: it may delete annotations (restorable in the admin).
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="annotations", codename="delete_annotation")
    )
    return created


def demo_user_reset() -> None:
    """Give the demo user back its password, an active account and its starting credits."""
    demo_user_ensure()
    user = get_user_model().objects.get(username=DEMO_USERNAME)
    user.is_active = True
    user.set_password(DEMO_PASSWORD)
    user.save(update_fields=["is_active", "password"])
    credit_set(user=user, balance=DEMO_CREDITS)
