"""Bearer tokens for the HTTP API and the socket, and each user's credit balance."""

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import MD5

from geosense.fields import NulFreeTextField


class ApiToken(models.Model):
    """A bearer token; only its SHA-256 digest is stored, so a database leak reveals none."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(
        max_length=8, help_text="The token's first characters, to tell tokens apart."
    )
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    # A token authenticates the HTTP API and the socket only (never the admin or the pages),
    # until it expires or its owner revokes it (deletes it).
    expires = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class CreditAccount(models.Model):
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="credit_account"
    )
    balance = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(balance__gte=0), name="credit_balance_not_negative")
        ]

    def __str__(self) -> str:
        return f"{self.user}: {self.balance} credits"


class CreditCharge(models.Model):
    """One ledger entry: what a tool call cost. The balance is charged in the same transaction.

    A charge is keyed by the stored call, the session and the call's id within it: a model's
    call id alone is unique only inside one session (servers that send none get `call_0`).
    Call ids are stored whole (some servers send thousands of characters), so the key is on
    the id's MD5: a B-tree row on PostgreSQL holds at most 2,704 bytes.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="credit_charges"
    )
    amount = models.PositiveIntegerField()
    session_id = models.CharField(max_length=64)
    tool_call_id = NulFreeTextField()
    tool_name = models.CharField(max_length=64)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]
        constraints = [
            models.UniqueConstraint(
                F("session_id"), MD5("tool_call_id"), name="one_charge_per_stored_call"
            )
        ]

    def __str__(self) -> str:
        return f"{self.amount} credits for {self.tool_name} ({self.tool_call_id})"
