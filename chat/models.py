"""Chat sessions, their transcript, their data contexts and the pauses of their turns.

The transcript is stored in the shape an LLM is fed: user messages, assistant messages with
the tool calls they made, and one `tool` message per call holding its result. The engine
keeps the invariant that every call has exactly one result (docs/architecture.md, "Engine
invariants").

Tool-call ids and the names a model writes are stored whole, whatever their length: servers send
ids of thousands of characters (LiteLLM glues Gemini's thought signature onto the id) and they
must go back verbatim. An index on such text would exceed PostgreSQL's B-tree row limit
(2,704 bytes), so uniqueness over a call id is kept on its MD5 digest instead. Text and JSON
from outside go through the NUL-free fields of geosense/fields.py (PostgreSQL refuses NUL).
"""

import uuid

from django.conf import settings
from django.contrib.auth.models import User
from django.db import models
from django.db.models import F
from django.db.models.functions import MD5

from geosense.fields import NulFreeCharField, NulFreeJSONField, NulFreeTextField


class ChatSession(models.Model):
    class TurnState(models.TextChoices):
        IDLE = "idle"
        RUNNING = "running"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_sessions"
    )
    title = NulFreeCharField(max_length=200, blank=True)
    allow_backend_tools = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    # The claim that keeps one turn per session across processes (chat/turns.py).
    turn_state = models.CharField(max_length=16, choices=TurnState.choices, default=TurnState.IDLE)
    turn_lease = models.DateTimeField(null=True, blank=True)
    # The process (`ServerProcess.id`) whose turn holds the claim: its death frees the session
    # at once instead of at the end of the lease (chat/processes.py).
    turn_owner = models.UUIDField(null=True, blank=True)
    turn_count = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return self.title or f"Session {self.pk}"


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"
        TOOL = "tool"
        # A note from the app (e.g. "the model's server failed"): shown, never sent to the model.
        NOTE = "note"

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="messages")
    turn = models.PositiveIntegerField(default=0)
    role = models.CharField(max_length=16, choices=Role.choices)
    content = NulFreeTextField(blank=True)
    # Assistant messages: [{"id", "name", "arguments"}] with arguments as the model's JSON text.
    tool_calls = NulFreeJSONField(default=list, blank=True)
    # Tool messages: which call this answers, and whether the answer is a refusal or error.
    tool_call_id = NulFreeTextField(blank=True)
    # Whatever name the model wrote, even one no tool has (its result then says so).
    tool_name = NulFreeTextField(blank=True)
    is_error = models.BooleanField(default=False)
    # Assistant text stored while it streamed (every second or so) whose stream never finished:
    # the process died, the model failed or the turn was stopped. It stays what the user saw.
    cut_off = models.BooleanField(default=False)
    # Tool messages of a client tool's call: the call in a person's words, kept from the
    # page's declaration (the page that declared it is gone after a reload), for the activity
    # log (chat/activity.py).
    TITLE_MAX_CHARS = 80
    SUMMARY_MAX_CHARS = 300
    title = NulFreeCharField(max_length=TITLE_MAX_CHARS, blank=True)
    summary = NulFreeCharField(max_length=SUMMARY_MAX_CHARS, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        # A page of the transcript is a range of turns (chat/pages.py): read through this
        # index, its cost follows the turns shown, not the session's length.
        indexes = [models.Index(fields=["session", "turn"], name="chat_message_session_turn")]
        constraints = [
            # Engine invariant 1 (docs/architecture.md): at most one result per tool call.
            models.UniqueConstraint(
                F("session"),
                MD5("tool_call_id"),
                condition=models.Q(role="tool"),
                name="one_result_per_tool_call",
            )
        ]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:60]}"


class Artifact(models.Model):
    """A data context of the session, addressable from markup as `${artifact_id.path}`."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="artifacts")
    artifact_id = models.CharField(max_length=64)
    kind = models.CharField(max_length=32)
    data = NulFreeJSONField()
    origin = models.CharField(max_length=64, help_text="tool:<name> or client:<context type>")
    message = models.ForeignKey(Message, null=True, blank=True, on_delete=models.SET_NULL)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["session", "artifact_id"], name="unique_artifact_id")
        ]

    def __str__(self) -> str:
        return self.artifact_id


class Pause(models.Model):
    """A tool call the turn waits on, as data: the exact call (id, name, arguments) and how the
    wait ended. Approvals and pending decisions share this vocabulary; `status` moves from
    `pending` exactly once, by a conditional update (docs/architecture.md, "Engine invariants").
    """

    tool_call_id = NulFreeTextField()
    tool_name = models.CharField(max_length=64)
    arguments = NulFreeJSONField(default=dict)
    decided_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.tool_name} ({self.status})"


class Approval(Pause):
    """A backend tool call waiting for the user's approval."""

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        SET_ASIDE = "set_aside"

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="approvals")
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="approvals")
    reasons = models.JSONField(default=list)
    cost_credits = models.PositiveIntegerField(default=0)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta(Pause.Meta):
        pass


class PendingDecision(Pause):
    """A blocking client-tool call that the reader answers (no `serve`)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        ANSWERED = "answered"
        SET_ASIDE = "set_aside"

    session = models.ForeignKey(
        ChatSession, on_delete=models.CASCADE, related_name="pending_decisions"
    )
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="pending_decisions")
    TITLE_MAX_CHARS = 80
    SUMMARY_MAX_CHARS = 300

    # The declaration as registered when the call was made: the answer is validated against it.
    result_schema = NulFreeJSONField(default=dict)
    # The card's words, kept from the declaration (the page that declared it may be gone).
    title = NulFreeCharField(max_length=TITLE_MAX_CHARS, blank=True)
    summary = NulFreeCharField(max_length=SUMMARY_MAX_CHARS, blank=True)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True
    )

    class Meta(Pause.Meta):
        pass


class ClientToolRegistration(models.Model):
    """The client tools one socket declared; every process reads them from here.

    Keyed by the socket's channel name; deleted when the socket closes, or with its process.
    """

    channel_name = models.CharField(max_length=255, unique=True)
    session = models.ForeignKey(
        ChatSession, on_delete=models.CASCADE, related_name="client_tool_registrations"
    )
    # The process holding the socket (`ServerProcess.id`): a registration whose process stopped
    # heartbeating is nobody's, however it ended (chat/processes.py).
    process = models.UUIDField(null=True, blank=True)
    tools = NulFreeJSONField(default=list)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated"]

    def __str__(self) -> str:
        return f"{self.channel_name} → {self.session_id}"


class ServerProcess(models.Model):
    """A running Daphne (or other) process of this deployment, with its heartbeat.

    Turn claims and socket registrations name the process holding them; a process that stopped
    heartbeating (killed, frozen, its machine gone) holds nothing any more, so its sessions
    take a new turn within seconds, not at the end of the lease (chat/processes.py).
    """

    id = models.UUIDField(primary_key=True, editable=False)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started = models.DateTimeField(auto_now_add=True)
    heartbeat = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"


class TurnUsage(models.Model):
    """The model tokens one turn used, as its server reported them, and the credits they cost
    (chat/usage.py). One row per turn; a resumed turn adds to it."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="usages")
    # The session's owner, kept here so the totals per user are one indexed aggregate.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="turn_usages"
    )
    turn = models.PositiveIntegerField()
    requests = models.PositiveIntegerField(default=0, help_text="requests that reported usage")
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    credits = models.PositiveIntegerField(default=0, help_text="charged through the ledger")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created"]
        constraints = [
            models.UniqueConstraint(fields=["session", "turn"], name="one_usage_per_turn")
        ]

    def __str__(self) -> str:
        return f"turn {self.turn}: {self.prompt_tokens} + {self.completion_tokens} tokens"


class UserModelUsage(User):
    """The users, seen in the admin for what their turns used of the model (no table)."""

    class Meta:
        proxy = True
        verbose_name = "model usage per user"
        verbose_name_plural = "model usage per user"
