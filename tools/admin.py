from django.contrib import admin

from .models import ClientToolRegistration


@admin.register(ClientToolRegistration)
class ClientToolRegistrationAdmin(admin.ModelAdmin):
    list_display = ("channel_name", "session", "updated")
    readonly_fields = ("channel_name", "session", "tools", "updated")
