"""The chat page's views: ownership, the server-rendered transcript and its partials."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from chat import approvals, services
from chat.models import ChatSession, Message
from geosense.accounts.services import credit_set

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice():
    user = get_user_model().objects.create_user(username="alice", password="pw")
    credit_set(user=user, balance=42)
    return user


@pytest.fixture
def browser(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def session(alice) -> ChatSession:
    return ChatSession.objects.create(user=alice, title="Trees near houses")


def _paused_turn(session: ChatSession, *, tool: str = "delete_annotations") -> Message:
    services.message_store(
        session_id=session.pk, turn=1, role="user", content="delete annotation 12"
    )
    call = {"id": "call_1", "name": tool, "arguments": '{"ids": [12]}'}
    message = services.message_store(
        session_id=session.pk, turn=1, role="assistant", content="", tool_calls=[call]
    )
    approvals.approval_create(
        session_id=session.pk,
        message=message,
        tool_call_id=call["id"],
        tool_name=call["name"],
        arguments={"ids": [12]},
        reasons=["destructive", "credits"],
        cost=5,
    )
    return message


def test_the_page_requires_a_login(session):
    response = Client().get(f"/chat/{session.pk}/")

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_another_users_session_and_its_partials_answer_404(session):
    bob = get_user_model().objects.create_user(username="bob", password="pw")
    other = Client()
    other.force_login(bob)
    message = services.message_store(session_id=session.pk, turn=1, role="user", content="hi")

    assert other.get(f"/chat/{session.pk}/").status_code == 404
    assert other.get(f"/chat/{session.pk}/turns/1/").status_code == 404
    assert other.get(f"/chat/{session.pk}/messages/{message.pk}/").status_code == 404


def test_the_root_redirects_to_the_chat():
    response = Client().get("/")

    assert response.status_code == 302
    assert response["Location"] == "/chat/"


def test_new_conversation_opens_an_empty_chat_and_creates_no_session(browser, alice):
    """The session is created by the first message (POST /api/sessions), not by the button."""
    html = browser.get("/chat/").content.decode()

    assert 'data-testid="new-conversation" href="/chat/"' in html
    assert 'data-session-id=""' in html
    assert not ChatSession.objects.filter(user=alice).exists()
    assert browser.post("/chat/new/").status_code == 404


def test_the_transcript_shows_user_and_assistant_messages_but_not_tool_results(browser, session):
    services.message_store(session_id=session.pk, turn=1, role="user", content="how many trees?")
    services.tool_result_store(
        session_id=session.pk, turn=1, tool_call_id="c1", tool_name="count", content={"n": 3}
    )
    services.message_store(
        session_id=session.pk, turn=1, role="assistant", content="There are <b>3</b> trees."
    )

    html = browser.get(f"/chat/{session.pk}/").content.decode()

    assert 'data-role="user"' in html
    assert "how many trees?" in html
    assert "There are <b>3</b> trees." in html
    assert '{"n": 3}' not in html
    assert 'data-role="tool"' not in html


def test_a_pending_approval_renders_as_a_card_with_its_reasons_cost_and_credits(browser, session):
    _paused_turn(session)

    html = browser.get(f"/chat/{session.pk}/").content.decode()

    assert 'data-testid="approval-card"' in html
    assert 'data-status="pending"' in html
    assert "Deletes annotations" in html
    assert "Costs 5 credits" in html
    assert '<span class="credits-left">42</span>' in html
    assert 'data-decision="approve"' in html
    assert 'data-decision="reject"' in html


def test_an_approval_card_names_the_tool_and_the_call_in_words(browser, session):
    _paused_turn(session)

    html = browser.get(f"/chat/{session.pk}/").content.decode()

    assert ">Delete annotations</h3>" in html
    assert "#12 (an administrator can restore it)" in html
    assert "delete_annotations" not in html.replace('data-tool="delete_annotations"', "")
    assert "ids" not in html.split('data-testid="approval-card"')[1].split("</section>")[0]


def test_a_decision_card_keeps_the_words_of_the_page_that_declared_the_tool(browser, session):
    call = {"id": "call_2", "name": "map_select", "arguments": '{"prompt": "Pick the pools"}'}
    message = services.message_store(
        session_id=session.pk, turn=1, role="assistant", content="", tool_calls=[call]
    )
    approvals.decision_create(
        session_id=session.pk,
        message=message,
        tool_call_id=call["id"],
        tool_name=call["name"],
        arguments={"prompt": "Pick the pools", "class": "pool"},
        result_schema={"type": "object"},
        title="Pick annotations on the map",
        summary="Only pools: Pick the pools",
    )

    html = browser.get(f"/chat/{session.pk}/").content.decode()

    assert ">Pick annotations on the map</h3>" in html
    assert '<p class="decision-prompt">Only pools: Pick the pools</p>' in html


def test_a_decided_approval_shows_its_decision_without_buttons(browser, session):
    message = _paused_turn(session)
    message.approvals.update(status="rejected")

    html = browser.get(f"/chat/{session.pk}/turns/1/").content.decode()

    assert 'data-testid="approval-outcome">Rejected' in html
    assert 'data-decision="approve"' not in html


def test_model_text_is_escaped_in_the_transcript(browser, session):
    services.message_store(
        session_id=session.pk, turn=1, role="assistant", content="<script>alert(1)</script>"
    )

    html = browser.get(f"/chat/{session.pk}/").content.decode()

    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_the_message_partial_is_the_markup_of_the_full_page(browser, session):
    message = services.message_store(
        session_id=session.pk, turn=1, role="assistant", content='Look at <ref id="7" />.'
    )

    partial = browser.get(f"/chat/{session.pk}/messages/{message.pk}/")
    page = browser.get(f"/chat/{session.pk}/").content.decode()

    assert partial.status_code == 200
    assert partial["X-GeoSense-Credits"] == "42"
    assert partial.content.decode().strip() in page
    assert 'data-annotation-id="7"' in partial.content.decode()


def test_an_answered_question_renders_answered_after_reload(browser, session):
    services.message_store(
        session_id=session.pk,
        turn=1,
        role="assistant",
        content='<question id="q1"><header>Proceed?</header>'
        '<option message="Yes">Yes</option><option message="No">No</option></question>',
    )
    services.message_store(
        session_id=session.pk,
        turn=2,
        role="user",
        content='<answer question="q1" question-option-index="1">No</answer>',
    )

    html = browser.get(f"/chat/{session.pk}/").content.decode()

    assert 'class="markup-block question answered"' in html
    assert 'aria-pressed="true"' in html


def test_a_note_is_shown_as_escaped_text(browser, session):
    services.message_store(
        session_id=session.pk, turn=1, role="note", content="The model's server failed <500>"
    )

    html = browser.get(f"/chat/{session.pk}/").content.decode()

    assert 'class="message-note" role="note">The model&#x27;s server failed &lt;500&gt;' in html


# --- the streaming preview --------------------------------------------------------------------
def _preview(client: Client, session: ChatSession, body, **extra):
    return client.post(
        f"/chat/{session.pk}/preview/",
        data=body if isinstance(body, str) else json.dumps(body),
        content_type="application/json",
        **extra,
    )


def test_the_preview_renders_the_streamed_text_holding_back_half_open_markdown(browser, session):
    response = _preview(
        browser, session, {"text": '## Trees\n\n**12** near <ref id="3"/>\n\n```py\nx'}
    )

    assert response.status_code == 200
    html = response.content.decode()
    assert "<h2>Trees</h2>" in html and "<strong>12</strong>" in html
    assert 'data-annotation-id="3"' in html
    assert '<p class="markdown-pending">```py<br>x</p>' in html


def test_the_preview_fills_placeholders_from_the_sessions_own_artifacts_only(
    browser, session, alice
):
    mine = services.artifact_save(session_id=session.pk, kind="k", data={"n": 7}, origin="t")
    other = ChatSession.objects.create(user=alice)
    theirs = services.artifact_save(session_id=other.pk, kind="k", data={"n": 9}, origin="t")

    html = _preview(browser, session, {"text": f"${{{mine}.n}} and ${{{theirs}.n}}"}).content

    assert b"7 and " in html and b"missing value" in html


def test_the_preview_refuses_bad_bodies_other_users_and_oversized_text(browser, session):
    bob = get_user_model().objects.create_user(username="bob", password="pw")
    other = Client()
    other.force_login(bob)

    assert _preview(other, session, {"text": "x"}).status_code == 404
    assert _preview(Client(), session, {"text": "x"}).status_code == 302
    assert _preview(browser, session, "not json").status_code == 400
    assert _preview(browser, session, {"text": 5}).status_code == 400
    assert _preview(browser, session, {"text": "x" * 256_001}).status_code == 413
    assert browser.get(f"/chat/{session.pk}/preview/").status_code == 405


def test_the_preview_needs_the_csrf_token(alice, session):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)

    assert _preview(client, session, {"text": "x"}).status_code == 403
