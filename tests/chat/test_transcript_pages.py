"""A long session's pages cost what they show (issue 15, item 9): the page opens with the latest
turns and loads earlier ones page by page, a live update renders one turn, each message's HTML
is cached until something it depends on changes, and the API walks the transcript by cursor.
The progress of a running turn is what a page opened mid-turn shows (issue 16, item 9)."""

import re

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client

from chat import events, pages, rendered
from chat.models import ChatSession, Message
from geosense import wire

pytestmark = pytest.mark.django_db

TURNS = 45


@pytest.fixture
def alice():
    return get_user_model().objects.create_user(username="alice", password="pw")


@pytest.fixture
def browser(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def session(alice) -> ChatSession:
    return ChatSession.objects.create(user=alice, title="A long one")


@pytest.fixture
def renders(monkeypatch) -> list[int]:
    """The ids of the messages whose markup is rendered (not read from the cache)."""
    seen: list[int] = []
    real = rendered.render_message

    def counting(text, **kwargs):
        seen.append(kwargs["message_id"])
        return real(text, **kwargs)

    monkeypatch.setattr(rendered, "render_message", counting)
    return seen


def _long_session(session: ChatSession, turns: int = TURNS) -> None:
    messages = []
    for turn in range(1, turns + 1):
        messages.append(
            Message(session=session, turn=turn, role="user", content=f"question number {turn}")
        )
        messages.append(
            Message(session=session, turn=turn, role="assistant", content=f"answer number {turn}")
        )
    Message.objects.bulk_create(messages)


def _turns_in(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'<div class="turn" data-turn="(\d+)"', html)]


def _earlier_marker(html: str) -> int | None:
    match = re.search(r'class="transcript-earlier" data-before="(\d+)"', html)
    return int(match[1]) if match else None


def test_the_page_of_a_long_session_shows_only_its_latest_turns(browser, session):
    _long_session(session)

    html = browser.get(f"/chat/{session.pk}/").content.decode()

    latest = list(range(TURNS - pages.PAGE_TURNS + 1, TURNS + 1))
    assert _turns_in(html) == latest
    assert "answer number 1<" not in html
    assert _earlier_marker(html) == latest[0]


def test_scrolling_up_walks_every_earlier_turn_once_and_the_first_page_has_no_marker(
    browser, session
):
    _long_session(session)
    html = browser.get(f"/chat/{session.pk}/").content.decode()
    seen = _turns_in(html)
    before = _earlier_marker(html)
    while before is not None:
        response = browser.get(f"/chat/{session.pk}/turns/?before={before}")
        assert response.status_code == 200
        older = response.content.decode()
        assert max(_turns_in(older)) < min(seen)
        seen = _turns_in(older) + seen
        before = _earlier_marker(older)

    assert seen == list(range(1, TURNS + 1))


def test_the_earlier_turns_need_a_turn_number_and_the_sessions_owner(browser, session):
    _long_session(session, turns=3)
    other = Client()
    other.force_login(get_user_model().objects.create_user(username="mallory", password="pw"))

    assert browser.get(f"/chat/{session.pk}/turns/").status_code == 400
    assert browser.get(f"/chat/{session.pk}/turns/?before=x").status_code == 400
    assert other.get(f"/chat/{session.pk}/turns/?before=3").status_code == 404


def test_a_short_session_has_no_marker_of_earlier_turns(browser, session):
    _long_session(session, turns=3)

    html = browser.get(f"/chat/{session.pk}/").content.decode()

    assert _turns_in(html) == [1, 2, 3]
    assert _earlier_marker(html) is None


def test_a_live_update_renders_only_its_own_turn(browser, session, renders):
    _long_session(session)
    last = Message.objects.filter(session=session, turn=TURNS)

    response = browser.get(f"/chat/{session.pk}/turns/{TURNS}/")

    assert response.status_code == 200
    assert _turns_in(response.content.decode()) == [TURNS]
    assert sorted(renders) == sorted(m.pk for m in last)


def test_a_question_on_an_earlier_page_shows_its_answer_from_a_later_page(browser, session):
    _long_session(session)
    asker = Message.objects.create(
        session=session,
        turn=2,
        role="assistant",
        content='<question id="q1"><header>Which ones?</header>'
        '<option message="Small">Small</option><option message="Big">Big</option></question>',
    )
    Message.objects.create(
        session=session,
        turn=TURNS,
        role="user",
        content=f'<answer question="q1" question-option-index="1" asked-in="{asker.pk}">'
        "Big</answer>",
    )

    latest = browser.get(f"/chat/{session.pk}/").content.decode()
    first_page = browser.get(f"/chat/{session.pk}/turns/?before=6").content.decode()

    # The answer, on the latest page, shows the question it picks from an earlier page.
    assert "Which ones?" in latest
    # The question, on the first page, is answered (its option chosen, no buttons to press).
    assert 'class="markup-block question answered"' in first_page
    assert 'aria-pressed="true"' in first_page


def test_an_answer_without_asked_in_finds_the_latest_question_before_its_page(browser, session):
    _long_session(session)
    Message.objects.create(
        session=session,
        turn=1,
        role="assistant",
        content='<question id="q1"><header>Proceed?</header>'
        '<option message="Yes">Yes</option></question>',
    )
    Message.objects.create(
        session=session,
        turn=TURNS,
        role="user",
        content='<answer question="q1" question-option-index="0">Yes</answer>',
    )

    latest = browser.get(f"/chat/{session.pk}/").content.decode()

    assert "Proceed?" in latest


def test_each_message_is_rendered_once_until_something_it_shows_changes(browser, session, renders):
    asker = Message.objects.create(
        session=session,
        turn=1,
        role="assistant",
        content='<question id="q1"><header>Proceed?</header>'
        '<option message="Yes">Yes</option></question>',
    )
    browser.get(f"/chat/{session.pk}/")
    assert renders == [asker.pk]

    browser.get(f"/chat/{session.pk}/")
    assert renders == [asker.pk]  # the second time, from the cache

    answer = Message.objects.create(
        session=session,
        turn=2,
        role="user",
        content=f'<answer question="q1" question-option-index="0" asked-in="{asker.pk}">'
        "Yes</answer>",
    )
    html = browser.get(f"/chat/{session.pk}/").content.decode()

    # Answered, the question renders anew (its key changed); the answer renders for the first time.
    assert sorted(renders[1:]) == sorted([asker.pk, answer.pk])
    assert 'class="markup-block question answered"' in html

    Message.objects.filter(pk=asker.pk).update(content="Changed my mind.")
    html = browser.get(f"/chat/{session.pk}/").content.decode()
    assert "Changed my mind." in html


def test_the_cached_html_is_keyed_by_the_markup_version(browser, session, monkeypatch):
    Message.objects.create(session=session, turn=1, role="assistant", content="**bold**")
    browser.get(f"/chat/{session.pk}/")
    keys = [k for k in cache._cache if "message-html:" in k]  # locmem keys: ":1:<key>"

    assert len(keys) == 1
    assert f"message-html:{rendered.markup_version()}:" in keys[0]


# --- the API's cursor ------------------------------------------------------------------------
# Transactional: the API reads in the database pool's thread (geosense/dbpool.py), which cannot
# see a test transaction left open.


@pytest.mark.django_db(transaction=True)
def test_the_api_walks_every_message_exactly_once_by_cursor(browser, session):
    _long_session(session)
    all_ids = list(Message.objects.filter(session=session).values_list("pk", flat=True))

    seen: list[int] = []
    url = f"/api/sessions/{session.pk}?limit=7"
    while url:
        page = browser.get(url).json()
        assert len(page["messages"]) <= 7
        seen = [m["id"] for m in page["messages"]] + seen
        cursor = page["next_cursor"]
        url = f"/api/sessions/{session.pk}?limit=7&cursor={cursor}" if cursor else None

    assert seen == all_ids


@pytest.mark.django_db(transaction=True)
def test_the_api_without_a_cursor_keeps_the_whole_transcript_shape(browser, session):
    _long_session(session, turns=3)

    body = browser.get(f"/api/sessions/{session.pk}").json()

    assert len(body["messages"]) == 6
    assert "next_cursor" not in body


@pytest.mark.django_db(transaction=True)
def test_the_api_refuses_a_malformed_cursor_or_limit(browser, session):
    for query in ["cursor=12", "cursor=before:x", "limit=0", "limit=201", "limit=x"]:
        response = browser.get(f"/api/sessions/{session.pk}?{query}")
        assert response.status_code == 400, query
        assert "error" in response.json()


# --- a turn already running ------------------------------------------------------------------


def test_a_running_turns_progress_holds_its_events_so_far_with_its_text_as_one(session):
    sink = events.EventSink(session_id=session.pk)
    for event in [
        wire.turn_start(session=session.pk, turn=3),
        wire.text_delta("Hello, "),
        wire.text_delta("world"),
        wire.backend_thinking("looking"),
        wire.text_delta("More "),
        wire.text_delta("text"),
    ]:
        async_to_sync(sink.emit)(event)

    progress = events.turn_progress(session_id=session.pk)

    assert progress["running"] is True
    assert progress["turn"] == 3
    assert progress["seq"] == 6
    assert [(e["event"], e["data"]) for e in progress["events"]] == [
        ("turn_start", {"session": str(session.pk), "turn": 3}),
        ("text_delta", {"delta": "Hello, world"}),
        ("backend_thinking", {"text": "looking"}),
        ("text_delta", {"delta": "More text"}),
    ]

    async_to_sync(sink.emit)(wire.turn_end())
    assert events.turn_progress(session_id=session.pk) == {"running": False}


def test_the_progress_endpoint_answers_for_a_running_turn_only(browser, session):
    sink = events.EventSink(session_id=session.pk)
    async_to_sync(sink.emit)(wire.turn_start(session=session.pk, turn=1))
    async_to_sync(sink.emit)(wire.text_delta("so far"))

    assert browser.get(f"/chat/{session.pk}/progress/").json() == {"running": False}

    ChatSession.objects.filter(pk=session.pk).update(turn_state="running")
    progress = browser.get(f"/chat/{session.pk}/progress/").json()
    assert progress["running"] is True
    assert progress["seq"] == 2
    assert progress["events"][-1] == {"event": "text_delta", "data": {"delta": "so far"}}
    async_to_sync(sink.emit)(wire.turn_end())


def test_a_page_opened_while_a_turn_runs_has_send_disabled(browser, session):
    ChatSession.objects.filter(pk=session.pk).update(turn_state="running")

    html = browser.get(f"/chat/{session.pk}/").content.decode()

    assert re.search(
        r'<button type="submit" class="primary-button" id="send-button" disabled>', html
    )
    assert 'data-busy="true"' in html
