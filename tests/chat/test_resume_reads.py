"""A resume reads only its own message's results, not every result of the session (issue 15,
cause 2: nothing per step grows with the session in Python)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat.models import Message
from chat.selectors import calls_without_result
from tests.chat.conftest import make_caller
from tests.chat.test_history import add_turns

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_resume_reads_only_its_own_results():
    session = make_caller("lea").session
    add_turns(session, 300)
    calls = [{"id": f"x{n}", "name": "measure", "arguments": "{}"} for n in range(3)]
    message = Message.objects.create(session=session, turn=301, role="assistant", tool_calls=calls)
    Message.objects.create(session=session, turn=301, role="tool", content="{}", tool_call_id="x1")

    with CaptureQueriesContext(connection) as queries:
        remaining = calls_without_result(message=message)

    assert [c["id"] for c in remaining] == ["x0", "x2"]
    (query,) = queries.captured_queries
    assert "IN" in query["sql"]
