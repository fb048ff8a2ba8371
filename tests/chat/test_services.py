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
