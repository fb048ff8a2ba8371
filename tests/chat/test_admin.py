"""The admin shows sessions with their transcript and approvals with their session."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from chat.models import Approval, ChatSession, Message

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_with_data():
    client = Client()
    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    session = ChatSession.objects.create(user=admin, title="Trees near houses")
    Message.objects.create(
        session=session, role="user", content="show trees within 20 m of a house"
    )
    message = Message.objects.create(
        session=session,
        role="assistant",
        tool_calls=[{"id": "c1", "name": "spatial_relation", "arguments": "{}"}],
    )
    Approval.objects.create(
        session=session,
        message=message,
        tool_call_id="c1",
        tool_name="spatial_relation",
        reasons=["backend_access"],
    )
    return client, session


def test_a_session_page_shows_its_transcript_inline(admin_client_with_data):
    client, session = admin_client_with_data
    page = client.get(f"/admin/chat/chatsession/{session.pk}/change/")
    assert page.status_code == 200
    assert b"show trees within 20 m of a house" in page.content


def test_approvals_filter_by_status_and_link_to_their_session(admin_client_with_data):
    client, session = admin_client_with_data
    page = client.get("/admin/chat/approval/?status__exact=pending")
    assert page.status_code == 200
    assert f"/admin/chat/chatsession/{session.pk}/change/".encode() in page.content
    assert b"spatial_relation" in page.content
    assert b'class="field-tool_name"' in page.content
    assert (
        b'class="field-tool_name"'
        not in client.get("/admin/chat/approval/?status__exact=approved").content
    )
