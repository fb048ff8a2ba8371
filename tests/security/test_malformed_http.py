"""Issue 12, item 6: malformed requests answer the protocol's 4xx JSON, never a 500 or HTML.

Every body below is sent to every JSON endpoint that takes one; each answer must be a 4xx
with `{"error": ...}`. The counts of these lists are the "malformed HTTP bodies" row of
docs/security.md.
"""

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from chat.models import ChatSession
from geosense.accounts.services import api_token_create

DEEP = "[" * 100_000 + "]" * 100_000
NESTED_70 = (
    '{"text": "x", "contexts": [{"type": "visibility", "data": ' + "[" * 70 + "]" * 70 + "}]}"
)

MALFORMED_BODIES = [
    ("not JSON", "{"),
    ("a JSON array", "[1, 2]"),
    ("a JSON string", '"text"'),
    ("a JSON number", "12"),
    ("null", "null"),
    ("nested 100,000 deep", DEEP),
    ("an object nested 100,000 deep", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    ("nested 70 levels in a context", NESTED_70),
    ("a lone surrogate in text", '{"text": "a\\ud800b"}'),
    ("a lone surrogate in title", '{"title": "\\udfff"}'),
    ("a lone low surrogate before a high one", '{"text": "\\udc00\\ud800"}'),
    ("invalid UTF-8", b'{"text": "\xff\xfe"}'),
    ("a NUL byte", '{"text": "a\\u0000b"}'),
    ("text not a string", '{"text": 5}'),
    ("text empty", '{"text": "   "}'),
    ("text too long", json.dumps({"text": "x" * 20_001})),
    ("contexts not a list", '{"text": "x", "contexts": {}}'),
    (
        "too many contexts",
        json.dumps({"text": "x", "contexts": [{"type": "image", "data": 1}] * 9}),
    ),
    ("a context of unknown type", '{"text": "x", "contexts": [{"type": "script", "data": 1}]}'),
    ("an approval id of 2**70", json.dumps({"approval": 2**70, "decision": "approve"})),
    ("an approval id of -1", '{"approval": -1, "decision": "approve"}'),
    ("an approval id true", '{"approval": true, "decision": "approve"}'),
    ("a decision not approve/reject", '{"approval": 1, "decision": "maybe"}'),
    ("a tool_call id not a string", '{"tool_call": 5, "result": {}}'),
    ("a result not an object", '{"tool_call": "c1", "result": []}'),
    ("a sample id of 2**70", json.dumps({"samples": [{"id": 2**70}]})),
    ("a sample id of 1e308", '{"samples": [{"id": 1e308}]}'),
    ("a sample id NaN", '{"samples": [{"id": NaN}]}'),
    ("samples empty", '{"samples": []}'),
    ("21 samples", json.dumps({"samples": [{"id": 1}] * 21})),
    ("k of 10**30", json.dumps({"samples": [{"id": 1}], "k": 10**30})),
    ("k of 0", '{"samples": [{"id": 1}], "k": 0}'),
    ("allow_backend_tools a string", '{"allow_backend_tools": "yes"}'),
    ("title not a string", '{"title": ["t"]}'),
    ("a huge integer literal", '{"text": ' + "9" * 5000 + "}"),
    ("Infinity", '{"text": Infinity}'),
]

ENDPOINTS = [
    ("post", "/api/sessions"),
    ("patch", "/api/sessions/{session}"),
    ("post", "/api/sessions/{session}/message/stream"),
    ("post", "/api/sessions/{session}/message/resume/stream"),
    ("post", "/api/sessions/{session}/find-similar"),
]


@pytest.fixture
def mallory(transactional_db):
    # Transactional: a valid message starts a turn, whose ORM work runs in the engine's own
    # threads (chat/turns.py), which cannot see a test transaction left open.
    user = get_user_model().objects.create_user("mallory")  # no password: no hashing
    session = ChatSession.objects.create(user=user)
    return user, api_token_create(user=user), session


def _is_json_error(response) -> bool:
    return response["Content-Type"].startswith("application/json") and "error" in json.loads(
        response.content
    )


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
@pytest.mark.parametrize(("label", "body"), MALFORMED_BODIES, ids=[b[0] for b in MALFORMED_BODIES])
def test_a_malformed_body_answers_4xx_json(mallory, method, path, label, body):
    _user, token, session = mallory
    client = Client(raise_request_exception=False)
    response = getattr(client, method)(
        path.format(session=session.pk),
        data=body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    if response.status_code == 200 and "stream" in path:
        return  # a body this endpoint reads as valid (a NUL is a character like any other)
    assert response.status_code in (200, 201) or 400 <= response.status_code < 500, label
    if response.status_code >= 400:
        assert _is_json_error(response), response.content[:200]


@pytest.mark.parametrize(
    ("label", "body"),
    [b for b in MALFORMED_BODIES if "surrogate" in b[0] or "nested" in b[0] or "2**70" in b[0]],
    ids=lambda value: value if isinstance(value, str) and len(value) < 60 else "",
)
def test_the_reported_crashes_now_answer_400(mallory, label, body):
    """The issue's reproductions: RecursionError, UnicodeEncodeError, OverflowError were 500s."""
    _user, token, session = mallory
    client = Client(raise_request_exception=False)
    path = "/api/sessions"
    if "approval" in label:
        path = f"/api/sessions/{session.pk}/message/resume/stream"
    elif "sample" in label:
        path = f"/api/sessions/{session.pk}/find-similar"
    elif "text" in label or "context" in label:
        path = f"/api/sessions/{session.pk}/message/stream"
    response = client.post(
        path,
        data=body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 400, (label, response.content[:200])
    assert _is_json_error(response)


def test_an_unknown_api_path_and_a_wrong_method_answer_json(mallory):
    _user, token, _session = mallory
    client = Client()
    auth = {"Authorization": f"Bearer {token}"}
    missing = client.get("/api/nothing-here", headers=auth)
    assert (missing.status_code, json.loads(missing.content)) == (404, {"error": "not found"})
    wrong = client.delete("/api/sessions", headers=auth)
    assert wrong.status_code == 405 and _is_json_error(wrong)
    assert wrong["Allow"] == "GET, POST"


def test_an_exception_in_a_view_answers_json_500(mallory, monkeypatch):
    _user, token, _session = mallory

    def broken(**kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("chat.selectors.session_list", broken)
    response = Client(raise_request_exception=False).get(
        "/api/sessions", headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 500
    assert json.loads(response.content) == {"error": "internal server error"}


@pytest.mark.parametrize(
    ("method", "path"), [*ENDPOINTS, ("delete", "/api/sessions/{session}")], ids=str
)
def test_an_anonymous_write_answers_the_contracts_json_401(mallory, method, path):
    _user, _token, session = mallory
    response = getattr(Client(enforce_csrf_checks=True), method)(
        path.format(session=session.pk), data="{}", content_type="application/json"
    )
    assert response.status_code in (401, 405)
    assert _is_json_error(response)
    if response.status_code == 401:
        assert json.loads(response.content) == {"error": "authentication required"}


def test_a_cookie_write_without_its_csrf_token_answers_json_403(mallory):
    user, _token, _session = mallory
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post("/api/sessions", data="{}", content_type="application/json")
    assert response.status_code == 403
    assert json.loads(response.content)["error"].startswith("CSRF check failed")


def test_pages_outside_the_api_keep_their_html_errors(db):
    response = Client().get("/no-such-page/")
    assert response.status_code == 404
    assert not response["Content-Type"].startswith("application/json")
