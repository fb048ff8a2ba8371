"""Bearer tokens: expiry, scope (the API and the socket, never the admin), the owner's list
and revocation, and sockets that close when their authentication goes away (issue 12, item 8)."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from geosense.accounts.models import ApiToken, CreditAccount
from geosense.accounts.services import api_token_authenticate, api_token_create, credit_set
from geosense.asgi import application


def _user(name: str, **extra):
    return get_user_model().objects.create_user(name, **extra)


def _get(path: str, token: str):
    return Client().get(path, headers={"Authorization": f"Bearer {token}"})


@pytest.mark.django_db
def test_a_token_works_until_it_expires():
    alice = _user("alice")
    token = api_token_create(user=alice, days=1)
    assert _get("/api/sessions", token).status_code == 200
    ApiToken.objects.update(expires=timezone.now() - timedelta(seconds=1))
    answer = _get("/api/sessions", token)
    assert answer.status_code == 401
    assert json.loads(answer.content) == {"error": "invalid bearer token"}


def _fields(instance) -> list:
    return [getattr(instance, field.attname) for field in instance._meta.concrete_fields]


@pytest.mark.django_db
def test_a_token_is_read_with_its_user_as_the_orm_reads_them():
    """Every request reads its token with its user in SQL compiled once per process
    (geosense/compiled.py): the same token and user as the ORM's, field for field."""
    alice = _user("alice", email="alice@example.org", first_name="Alice")
    raw = api_token_create(user=alice)
    api_token_authenticate(raw=raw)  # writes last_used
    expected = ApiToken.objects.select_related("user").get(user=alice)
    for _ in range(2):  # the first read may compile it, the next runs the kept SQL
        token = api_token_authenticate(raw=raw)
        assert _fields(token) == _fields(expected)
        assert _fields(token.user) == _fields(expected.user)
        assert token.user.is_authenticated and token.user.check_password("") is False
    assert api_token_authenticate(raw=raw + "x") is None


@pytest.mark.django_db
def test_a_staff_token_opens_neither_the_admin_nor_the_pages():
    root = _user("root", is_staff=True, is_superuser=True)
    token = api_token_create(user=root)
    credit_set(user=root, balance=10)
    account = CreditAccount.objects.get(user=root)
    for path in ("/admin/", "/chat/", f"/admin/accounts/creditaccount/{account.pk}/change/"):
        answer = _get(path, token)
        assert answer.status_code == 401, path
        assert (
            "accepted by /api/, /tiles/ and the socket only" in json.loads(answer.content)["error"]
        )
    changed = Client().post(
        f"/admin/accounts/creditaccount/{account.pk}/change/",
        {"user": root.pk, "balance": 1_000_000},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert changed.status_code == 401
    assert CreditAccount.objects.get(user=root).balance == 10


@pytest.mark.django_db
def test_an_owner_lists_and_revokes_their_own_tokens_only():
    alice, bob = _user("alice"), _user("bob")
    first, second = api_token_create(user=alice), api_token_create(user=alice)
    bobs = api_token_create(user=bob)
    listed = json.loads(_get("/api/tokens", first).content)["tokens"]
    assert sorted(t["prefix"] for t in listed) == sorted([first[:8], second[:8]])
    assert set(listed[0]) == {"id", "prefix", "created", "last_used", "expires", "expired"}
    bobs_id = ApiToken.objects.get(user=bob).pk
    client = Client()
    auth = {"Authorization": f"Bearer {first}"}
    assert client.delete(f"/api/tokens/{bobs_id}", headers=auth).status_code == 404
    second_id = next(t["id"] for t in listed if t["prefix"] == second[:8])
    assert client.delete(f"/api/tokens/{second_id}", headers=auth).status_code == 200
    assert _get("/api/sessions", second).status_code == 401
    assert _get("/api/sessions", bobs).status_code == 200


@pytest.mark.django_db
def test_the_command_prints_one_line_and_takes_a_lifetime():
    _user("carol")
    out = StringIO()
    call_command("api_token", "carol", "--days", "7", stdout=out)
    (line,) = out.getvalue().splitlines()
    assert line.startswith("gs_")
    expires = ApiToken.objects.get().expires
    assert timedelta(days=6, hours=23) < expires - timezone.now() <= timedelta(days=7)


# --- sockets -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_layer():
    async_to_sync(get_channel_layer().flush)()


async def _socket(token: str) -> WebsocketCommunicator:
    ws = WebsocketCommunicator(
        application, "/ws/chat/", headers=[(b"authorization", f"Bearer {token}".encode())]
    )
    assert (await ws.connect())[0]
    return ws


async def _closed_with_4401(ws: WebsocketCommunicator) -> bool:
    message = await ws.receive_output(timeout=3)
    return message == {"type": "websocket.close", "code": 4401}


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_socket_closes_when_its_token_is_revoked():
    alice = await database_sync_to_async(_user)("alice")
    token = await database_sync_to_async(api_token_create)(user=alice)
    other = await database_sync_to_async(api_token_create)(user=alice)
    ws, untouched = await _socket(token), await _socket(other)
    await ApiToken.objects.filter(prefix=token[:8]).adelete()
    assert await _closed_with_4401(ws)
    assert await untouched.receive_nothing()
    await untouched.disconnect()
    refused = WebsocketCommunicator(
        application, "/ws/chat/", headers=[(b"authorization", f"Bearer {token}".encode())]
    )
    assert (await refused.connect())[0]
    assert await _closed_with_4401(refused)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_every_socket_of_a_user_closes_when_the_user_is_deactivated():
    alice = await database_sync_to_async(_user)("alice")
    ws = await _socket(await database_sync_to_async(api_token_create)(user=alice))
    alice.is_active = False
    await alice.asave()
    assert await _closed_with_4401(ws)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_socket_closes_when_its_token_expires():
    alice = await database_sync_to_async(_user)("alice")
    token = await database_sync_to_async(api_token_create)(user=alice)
    await ApiToken.objects.aupdate(expires=timezone.now() + timedelta(seconds=0.5))
    ws = await _socket(token)
    assert await _closed_with_4401(ws)


@pytest.mark.django_db
def test_a_locked_database_at_the_last_used_write_does_not_refuse_the_token(monkeypatch):
    """`last_used` is bookkeeping: a lock at its write (12 turns at once in the request pool
    met one in the shared-cache test database) must not turn a valid token into a 500."""
    from django.db import OperationalError
    from django.db.models.query import QuerySet

    token = api_token_create(user=_user("alice"))

    def locked(self, **kwargs):
        raise OperationalError("database table is locked: accounts_apitoken")

    monkeypatch.setattr(QuerySet, "update", locked)
    assert _get("/api/sessions", token).status_code == 200


@pytest.mark.django_db
def test_a_locked_database_at_the_token_read_answers_503_to_send_again(monkeypatch):
    from django.db import OperationalError

    from geosense.accounts import middleware

    token = api_token_create(user=_user("alice"))

    def locked(*, raw):
        raise OperationalError("database table is locked: accounts_apitoken")

    monkeypatch.setattr(middleware, "api_token_user", locked)
    answer = _get("/api/sessions", token)
    assert answer.status_code == 503
    assert answer["Retry-After"] == "1"
    assert json.loads(answer.content) == {
        "error": "the database is busy; please send the request again"
    }
