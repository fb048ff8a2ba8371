"""`GET /healthz`: 200 when the database, the channel layer and the migrations are fine, else 503
with the failing check named (PostgreSQL + Redis: tests/scale/test_health.py)."""

import json

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.test import AsyncClient

from tests.browser.daphne_server import free_port

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def get_health() -> tuple[int, dict]:
    response = await AsyncClient().get("/healthz")
    assert response["Content-Type"] == "application/json"
    assert "no-store" in response["Cache-Control"]
    return response.status_code, json.loads(response.content)


async def test_a_healthy_process_answers_200_naming_each_check():
    status, body = await get_health()

    assert status == 200
    assert body["status"] == "ok"
    checks = body["checks"]
    assert checks["database"]["ok"] and checks["database"]["vendor"] == "sqlite"
    assert checks["channel_layer"]["ok"]
    assert checks["channel_layer"]["backend"] == "InMemoryChannelLayer"
    assert checks["migrations"] == {"ok": True, "ms": checks["migrations"]["ms"], "unapplied": []}


async def test_repeated_checks_reuse_one_channel_and_stay_healthy():
    for _ in range(5):
        assert (await get_health())[0] == 200


async def test_an_unreachable_channel_layer_answers_503_and_says_which(settings):
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [f"redis://127.0.0.1:{free_port()}/0"]},
        }
    }
    status, body = await get_health()

    assert status == 503
    assert body["status"] == "failing"
    assert body["checks"]["channel_layer"]["ok"] is False
    assert body["checks"]["channel_layer"]["error"] == "ConnectionError"
    assert body["checks"]["database"]["ok"] and body["checks"]["migrations"]["ok"]


async def test_a_process_newer_than_the_database_answers_503_naming_the_migration():
    """As when a new release starts before `migrate` ran: its latest migration is not applied."""
    leaves = await sync_to_async(lambda: MigrationLoader(connection).graph.leaf_nodes())()
    (latest,) = [name for app, name in leaves if app == "chat"]
    recorder = MigrationRecorder(connection)
    await sync_to_async(recorder.record_unapplied)("chat", latest)
    try:
        status, body = await get_health()
    finally:  # the table outlives the test (a transactional test flushes only the app's tables)
        await sync_to_async(recorder.record_applied)("chat", latest)

    assert status == 503
    assert body["checks"]["migrations"]["ok"] is False
    assert body["checks"]["migrations"]["unapplied"] == [f"chat.{latest}"]


async def test_only_get_and_head_are_answered():
    assert (await AsyncClient().post("/healthz")).status_code == 405
    assert (await AsyncClient().head("/healthz")).status_code == 200
