"""Admin for credit balances, the credit ledger and bearer tokens."""

from django.contrib import admin

from geosense.readonly_admin import ReadOnlyAdmin

from .models import ApiToken, CreditAccount, CreditCharge


@admin.register(CreditAccount)
class CreditAccountAdmin(admin.ModelAdmin):
    list_display = ["user", "balance"]
    search_fields = ["user__username"]
    list_select_related = ["user"]
    autocomplete_fields = ["user"]


@admin.register(CreditCharge)
class CreditChargeAdmin(ReadOnlyAdmin):
    """The ledger is append-only: entries are written with their charge, never edited."""

    list_display = ["created", "user", "amount", "tool_name", "tool_call_id", "session_id"]
    list_filter = ["tool_name"]
    search_fields = ["user__username", "tool_call_id", "session_id"]
    list_select_related = ["user"]
    date_hierarchy = "created"


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created by `manage.py api_token` (the only time one is shown); here they
    can be inspected and revoked (deleted)."""

    list_display = ["prefix", "user", "created", "last_used", "expires"]
    search_fields = ["user__username", "prefix"]
    list_select_related = ["user"]
    readonly_fields = ["user", "prefix", "created", "last_used", "expires"]
    exclude = ["digest"]

    def has_add_permission(self, request) -> bool:
        return False
