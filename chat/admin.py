"""The chat admin: sessions with their transcript, pauses, artifacts, and the model tokens
and credits used per turn, per session and per user."""

from django.contrib import admin
from django.db.models import Count, QuerySet, Sum
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils.html import format_html

from geosense.readonly_admin import ReadOnlyAdmin

from .models import (
    Approval,
    Artifact,
    ChatSession,
    ClientToolRegistration,
    Message,
    PendingDecision,
    TurnUsage,
    UserModelUsage,
)


class MessageInline(admin.TabularInline):
    model = Message
    fields = (
        "id",
        "turn",
        "role",
        "content",
        "tool_calls",
        "tool_call_id",
        "tool_name",
        "is_error",
        "created",
    )
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True
    ordering = ("id",)

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class ArtifactInline(admin.TabularInline):
    model = Artifact
    fields = ("artifact_id", "kind", "origin", "created")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class TurnUsageInline(admin.TabularInline):
    model = TurnUsage
    fields = ("turn", "requests", "prompt_tokens", "completion_tokens", "credits", "updated")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("turn",)

    def has_add_permission(self, request, obj=None) -> bool:
        return False


def _with_token_totals(queryset: QuerySet, prefix: str) -> QuerySet:
    """Each row with the model tokens and credits of its turns, summed in the query."""
    return queryset.annotate(
        prompt_total=Coalesce(Sum(f"{prefix}__prompt_tokens"), 0),
        completion_total=Coalesce(Sum(f"{prefix}__completion_tokens"), 0),
        credits_total=Coalesce(Sum(f"{prefix}__credits"), 0),
    )


class TokenTotals:
    """Columns of the token totals `_with_token_totals` adds."""

    @admin.display(description="prompt tokens", ordering="prompt_total")
    def prompt_tokens(self, obj) -> int:
        return obj.prompt_total

    @admin.display(description="completion tokens", ordering="completion_total")
    def completion_tokens(self, obj) -> int:
        return obj.completion_total

    @admin.display(description="credits for tokens", ordering="credits_total")
    def token_credits(self, obj) -> int:
        return obj.credits_total


@admin.register(ChatSession)
class ChatSessionAdmin(TokenTotals, admin.ModelAdmin):
    list_display = (
        "title",
        "user",
        "allow_backend_tools",
        "turn_state",
        "turn_count",
        "prompt_tokens",
        "completion_tokens",
        "token_credits",
        "created",
        "updated",
    )
    list_filter = ("allow_backend_tools", "turn_state")
    search_fields = ("title", "user__username", "id")
    readonly_fields = ("id", "created", "updated", "turn_count")
    inlines = [TurnUsageInline, MessageInline, ArtifactInline]

    def get_queryset(self, request) -> QuerySet:
        return _with_token_totals(super().get_queryset(request), "usages")


@admin.register(UserModelUsage)
class UserModelUsageAdmin(TokenTotals, ReadOnlyAdmin):
    list_display = ("username", "turns", "prompt_tokens", "completion_tokens", "token_credits")
    search_fields = ("username",)
    fields = ("username",)
    readonly_fields = ("username",)

    def get_queryset(self, request) -> QuerySet:
        queryset = super().get_queryset(request).annotate(turn_total=Count("turn_usages"))
        return _with_token_totals(queryset, "turn_usages")

    @admin.display(description="turns with usage", ordering="turn_total")
    def turns(self, obj) -> int:
        return obj.turn_total


@admin.register(TurnUsage)
class TurnUsageAdmin(admin.ModelAdmin):
    """Written by the engine as servers report usage; read-only here."""

    list_display = (
        "updated",
        "user",
        "session_link",
        "turn",
        "requests",
        "prompt_tokens",
        "completion_tokens",
        "credits",
    )
    list_filter = ("user",)
    search_fields = ("user__username", "session__id")
    list_select_related = ("user", "session")
    date_hierarchy = "updated"
    readonly_fields = [f.name for f in TurnUsage._meta.fields]

    @admin.display(description="session")
    def session_link(self, obj: TurnUsage) -> str:
        return _session_link(obj)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


def _session_link(obj) -> str:
    url = reverse("admin:chat_chatsession_change", args=[obj.session_id])
    return format_html('<a href="{}">{}</a>', url, obj.session)


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "tool_name",
        "status",
        "reasons",
        "cost_credits",
        "session_link",
        "decided_by",
        "decided_at",
        "created",
    )
    list_filter = ("status", "tool_name")
    search_fields = ("tool_call_id", "session__id", "session__user__username")
    readonly_fields = [f.name for f in Approval._meta.fields]

    @admin.display(description="session")
    def session_link(self, obj: Approval) -> str:
        return _session_link(obj)


@admin.register(PendingDecision)
class PendingDecisionAdmin(admin.ModelAdmin):
    list_display = ("id", "tool_name", "status", "session_link", "decided_at", "created")
    list_filter = ("status", "tool_name")
    readonly_fields = [f.name for f in PendingDecision._meta.fields]

    @admin.display(description="session")
    def session_link(self, obj: PendingDecision) -> str:
        return _session_link(obj)


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("id", "session", "turn", "role", "tool_name", "is_error", "created")
    list_filter = ("role", "is_error")
    search_fields = ("content", "tool_call_id")
    readonly_fields = [f.name for f in Message._meta.fields]


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ("artifact_id", "kind", "origin", "session", "created")
    list_filter = ("kind",)
    search_fields = ("artifact_id",)
    readonly_fields = [f.name for f in Artifact._meta.fields]


@admin.register(ClientToolRegistration)
class ClientToolRegistrationAdmin(admin.ModelAdmin):
    list_display = ("channel_name", "session", "updated")
    readonly_fields = ("channel_name", "session", "tools", "updated")
