"""Client-tool registrations: what each socket declared, readable by every process."""

from django.db import models


class ClientToolRegistration(models.Model):
    """The client tools one socket declared; every process reads them from here.

    Keyed by the socket's channel name; deleted when the socket closes.
    """

    channel_name = models.CharField(max_length=255, unique=True)
    session = models.ForeignKey(
        "chat.ChatSession", on_delete=models.CASCADE, related_name="client_tool_registrations"
    )
    tools = models.JSONField(default=list)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated"]

    def __str__(self) -> str:
        return f"{self.channel_name} → {self.session_id}"
