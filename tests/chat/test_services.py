"""chat/services.py: the writes of the transcript."""

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from chat import services
from chat.models import ChatSession, Message

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_second_result_for_a_call_is_never_written_and_the_first_is_returned():
    """On its own (one insert, atomic by itself) and inside a caller's transaction, which goes
    on after the refusal (engine invariant 1)."""
    user = get_user_model().objects.create_user("results")
    session = ChatSession.objects.create(user=user)

    def store(content: str) -> Message:
        return services.tool_result_store(
            session_id=session.pk, turn=1, tool_call_id="c1", tool_name="x", content=content
        )

    first = store("first")
    assert store("second").pk == first.pk
    with transaction.atomic():
        assert store("third").pk == first.pk
        Message.objects.create(session=session, turn=1, role="note", content="still writes")
    stored = Message.objects.filter(session=session).order_by("id")
    assert [(m.role, m.content) for m in stored] == [("tool", "first"), ("note", "still writes")]


def test_a_sessions_first_message_titles_it_with_an_update_compiled_once(monkeypatch):
    """Every new session's first turn titles it from its message (a bench's level starts with
    every user's at once): the update is compiled once per process, as the ORM would write it
    (a NUL made U+FFFD), and only an untitled session takes it."""
    from geosense.fields import nul_free
    from tests.chat.costs import Costs

    user = get_user_model().objects.create_user("titles")
    first, second = (ChatSession.objects.create(user=user) for _ in range(2))
    kept = ChatSession.objects.create(user=user, title="Kept")
    services.message_store(session_id=first.pk, turn=1, role="user", content="hi", titled=False)
    with monkeypatch.context() as patched:
        costs = Costs(patched)
        services.message_store(
            session_id=second.pk, turn=1, role="user", content="Where\x00 is  it?", titled=False
        )
        services.message_store(session_id=kept.pk, turn=1, role="user", content="no", titled=False)
    assert costs.compiled == 0, costs.compiled
    assert ChatSession.objects.get(pk=second.pk).title == nul_free("Where\x00 is it?")
    assert ChatSession.objects.get(pk=kept.pk).title == "Kept"


def test_a_claim_numbers_the_new_turn_only_while_the_count_read_holds():
    """A new message's claim numbers its turn in the same update when given the count it read
    with nothing to repair; a count that moved since makes it the claim alone (the facts are
    then read again under it), and a running turn refuses both."""
    user = get_user_model().objects.create_user("numbers")
    session = ChatSession.objects.create(user=user, turn_count=3)

    assert services.session_claim(session_id=session.pk, numbered_from=3) is True
    session.refresh_from_db()
    assert (session.turn_state, session.turn_count) == ("running", 4)
    with pytest.raises(services.SessionBusy):
        services.session_claim(session_id=session.pk, numbered_from=4)

    services.session_release(session_id=session.pk)
    assert services.session_claim(session_id=session.pk, numbered_from=3) is False
    session.refresh_from_db()
    assert (session.turn_state, session.turn_count) == ("running", 4)
