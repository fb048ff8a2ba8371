"""Real concurrency against a live Daphne process and its SQLite file (no mocks)."""

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

CONCURRENT = 10


def _request(
    url: str, token: str, body: dict | None = None, method: str = "POST"
) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def llm_server(daphne_server_factory, fake_llm):
    return daphne_server_factory(
        env={"GEOSENSE_LLM_BASE_URL": fake_llm.base_url, "GEOSENSE_LLM_MODEL": "fake-model"}
    )


def test_ten_concurrent_approvals_run_the_call_once_and_charge_once(llm_server, fake_llm):
    token = llm_server.manage("api_token", "demo").strip()
    status, body = _request(f"{llm_server.url}/api/sessions", token, {"title": "race"})
    assert status == 201
    session = json.loads(body)["id"]
    base = f"{llm_server.url}/api/sessions/{session}"
    assert _request(base, token, {"allow_backend_tools": True}, method="PATCH")[0] == 200
    (sample,) = llm_server.sql(
        "SELECT id FROM annotations_annotation WHERE category = 'pool' ORDER BY id LIMIT 1"
    )
    fake_llm.reply_tool_calls(
        [("race_call", "similarity_search", {"samples": [{"id": sample[0]}], "k": 3})]
    )
    status, stream = _request(f"{base}/message/stream", token, {"text": "similar please"})
    assert status == 200
    approval = json.loads(stream.split("event: message\ndata: ", 1)[1].split("\n", 1)[0])[
        "pending_approval"
    ]
    (balance_before,) = llm_server.sql(
        "SELECT balance FROM accounts_creditaccount WHERE user_id = (SELECT id FROM auth_user WHERE username = 'demo')"
    )[0]
    fake_llm.reply_text("Found them.")

    start = threading.Barrier(CONCURRENT)

    def approve(_: int) -> int:
        start.wait()
        return _request(
            f"{base}/message/resume/stream",
            token,
            {"approval": approval["id"], "decision": "approve"},
        )[0]

    with ThreadPoolExecutor(CONCURRENT) as pool:
        statuses = list(pool.map(approve, range(CONCURRENT)))

    assert sorted(statuses) == [200] + [409] * (CONCURRENT - 1)
    assert llm_server.sql(
        "SELECT COUNT(*) FROM accounts_creditcharge WHERE tool_call_id = 'race_call'"
    ) == [(1,)]
    (balance_after,) = llm_server.sql(
        "SELECT balance FROM accounts_creditaccount WHERE user_id = (SELECT id FROM auth_user WHERE username = 'demo')"
    )[0]
    assert balance_after == balance_before - 5
    assert llm_server.sql(
        "SELECT COUNT(*) FROM chat_message WHERE tool_call_id = 'race_call' AND role = 'tool'"
    ) == [(1,)]
    assert (
        sum(1 for r in fake_llm.requests if r["messages"][-1].get("tool_call_id") == "race_call")
        == 1
    )
