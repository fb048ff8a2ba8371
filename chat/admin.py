from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from .models import (
    Approval,
    Artifact,
    ChatSession,
    ClientToolRegistration,
    Message,
    PendingDecision,
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


@admin.register(ChatSession)
class ChatSessionAdmin(admin.ModelAdmin):
    list_display = (
        "title",
        "user",
        "allow_backend_tools",
        "turn_state",
        "turn_count",
        "created",
        "updated",
    )
    list_filter = ("allow_backend_tools", "turn_state")
    search_fields = ("title", "user__username", "id")
    readonly_fields = ("id", "created", "updated", "turn_count")
    inlines = [MessageInline, ArtifactInline]


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
