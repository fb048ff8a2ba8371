"""Sockets close when their authentication goes away.

A revoked (deleted) token and a deactivated user send `auth.revoked` to the channel-layer
groups their sockets joined (`geosense.wire.auth_group_of_*`), after the change is committed;
the consumer closes each such socket with 4401. Through Redis this reaches every process.
"""

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from geosense import wire

from .models import ApiToken


def _revoke(group: str) -> None:
    layer = get_channel_layer()
    if layer is not None:
        transaction.on_commit(
            lambda: async_to_sync(layer.group_send)(group, wire.auth_revoked_message())
        )


@receiver(post_delete, sender=ApiToken, dispatch_uid="accounts.token_revoked")
def token_revoked(sender, instance: ApiToken, **kwargs) -> None:
    _revoke(wire.auth_group_of_token(instance.pk))


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="accounts.user_deactivated")
def user_deactivated(sender, instance, created: bool, **kwargs) -> None:
    if not created and not instance.is_active:
        _revoke(wire.auth_group_of_user(instance.pk))
