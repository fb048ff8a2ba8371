"""One base for the admin pages of what the app writes and the admin only shows."""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows written by the app (a ledger, a usage total): listed and opened, never added,
    changed or deleted through the admin."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
