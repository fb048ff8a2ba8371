"""The login form: throttled per account and address, the hash off the shared thread (issue
12, item 3)."""

import threading

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from geosense.accounts import login

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fast_hasher(settings):
    """What is tested is where and whether the hash runs, not its cost."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def alice(transactional_db, _fast_hasher):
    return get_user_model().objects.create_user("alice", password="right-password-1")


def _post(client: Client, password: str, *, address: str = "10.0.0.1", **data):
    return client.post(
        "/accounts/login/",
        {"username": "alice", "password": password, **data},
        REMOTE_ADDR=address,
    )


def test_the_right_password_logs_in_and_goes_to_next(alice):
    answer = _post(Client(), "right-password-1", next="/chat/")
    assert answer.status_code == 302 and answer["Location"] == "/chat/"


def test_an_unsafe_next_is_ignored(alice):
    answer = _post(Client(), "right-password-1", next="https://evil.example/")
    assert answer["Location"] == "/chat/"


def test_after_five_failures_even_the_right_password_is_refused_unread(alice, monkeypatch):
    client = Client()
    for _ in range(5):
        wrong = _post(client, "wrong")
        assert wrong.status_code == 200 and b"match. Please try again" in wrong.content
    checked = []
    real = login.password_check

    async def counting(form, **kwargs):
        checked.append(form)
        return await real(form, **kwargs)

    monkeypatch.setattr(login, "password_check", counting)
    refused = _post(client, "right-password-1")
    assert refused.status_code == 429
    assert b"Too many failed logins. Wait 15 minutes" in refused.content
    assert checked == []  # refused before any hash
    other_address = _post(client, "right-password-1", address="10.0.0.2")
    assert other_address.status_code == 302


def test_thirty_failures_from_one_address_refuse_every_username_there(alice):
    client = Client()
    for n in range(30):
        client.post(
            "/accounts/login/", {"username": f"nobody{n}", "password": "x"}, REMOTE_ADDR="10.9.9.9"
        )
    refused = _post(client, "right-password-1", address="10.9.9.9")
    assert refused.status_code == 429


def test_too_many_waiting_logins_are_refused_without_hashing(alice, monkeypatch):
    monkeypatch.setattr(login, "_waiting", login.WAITING_MAX)
    answer = _post(Client(), "right-password-1")
    assert answer.status_code == 429
    assert b"Too many logins at once" in answer.content


def test_the_password_is_checked_in_its_own_thread(alice, monkeypatch):
    from django.contrib.auth import forms

    threads = []
    real = forms.authenticate

    def recording(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(forms, "authenticate", recording)
    _post(Client(), "right-password-1")
    assert threads and threads[0].startswith("password")


def test_the_admin_logs_in_through_the_same_form(alice):
    page = Client().get("/admin/login/?next=/admin/")
    assert page.status_code == 200 and b"Log in to GeoSense" in page.content
