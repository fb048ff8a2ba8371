"""The client tools each socket registered, stored so that every process can read them."""

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from chat.models import ChatSession
from chat.selectors import (
    client_tools_and_revision,
    client_tools_offered,
    client_toolset_of_session,
)
from chat.services import client_tools_register, client_tools_unregister
from tests.client_tools import FOCUS, PICK
from tools.client import client_tool_declare


@pytest.fixture
def session(transactional_db) -> ChatSession:
    user = get_user_model().objects.create_user("carol")
    return ChatSession.objects.create(user=user)


def test_a_session_without_a_registered_socket_has_no_toolset(session):
    assert client_toolset_of_session(session_id=session.pk) is None


def test_registering_no_tools_removes_the_registration(session):
    tool = client_tool_declare(PICK, backend_names=())
    client_tools_register(channel_name="specific.a", session_id=session.pk, tools=[tool])
    assert client_toolset_of_session(session_id=session.pk).tools == {"map_select": tool}
    client_tools_register(channel_name="specific.a", session_id=session.pk, tools=[])
    assert client_toolset_of_session(session_id=session.pk) is None


def test_unregistering_a_socket_removes_only_its_tools(session):
    pick, show = (client_tool_declare(raw, backend_names=()) for raw in (PICK, FOCUS))
    client_tools_register(channel_name="specific.a", session_id=session.pk, tools=[pick])
    client_tools_register(channel_name="specific.b", session_id=session.pk, tools=[show])
    client_tools_unregister(channel_name="specific.b")
    toolset = client_toolset_of_session(session_id=session.pk)
    assert toolset.channel_name == "specific.a"
    assert list(toolset.tools) == ["map_select"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_registration_is_visible_to_async_callers(session):
    tool = client_tool_declare(FOCUS, backend_names=())
    await database_sync_to_async(client_tools_register)(
        channel_name="specific.c", session_id=session.pk, tools=[tool]
    )
    toolset = await database_sync_to_async(client_toolset_of_session)(session_id=session.pk)
    assert toolset.tools["map_focus"].kind == "one-way"


def test_a_declaration_is_decoded_once_and_a_new_one_is_read(session, monkeypatch):
    """Every step reads its session's registration: the tools of a declaration already seen
    (its stored text) are the ones made then; a socket that declares anew offers the new ones."""
    pick, show = (client_tool_declare(raw, backend_names=()) for raw in (PICK, FOCUS))
    client_tools_register(channel_name="specific.a", session_id=session.pk, tools=[pick])
    first = [client_toolset_of_session(session_id=session.pk) for _ in range(3)]
    assert first[1].tools["map_select"] is first[2].tools["map_select"]
    assert first[2].tools == {"map_select": pick}
    client_tools_register(channel_name="specific.a", session_id=session.pk, tools=[pick, show])
    toolset, specs = client_tools_offered(session_id=session.pk)
    assert toolset.tools == {"map_select": pick, "map_focus": show}
    assert specs.specs == (pick.openai_spec(), show.openai_spec())


def test_the_tools_read_gives_the_annotations_revision_of_its_own_statement(session, monkeypatch):
    """A step reads its session's tools and the annotations' revision in one statement: the
    revision is the row's as `AnnotationRevision.state()` reads it, after any write; a session
    without a socket's tools gives none (its step reads the revision as before)."""
    from geosense.annotations.models import AnnotationRevision
    from tests.chat.costs import Costs

    tool = client_tool_declare(PICK, backend_names=())
    client_tools_register(channel_name="specific.a", session_id=session.pk, tools=[tool])
    for bump in (False, True):
        if bump:
            AnnotationRevision.bump()
        client_tools_and_revision(session_id=session.pk)  # compiled by the first read
        with monkeypatch.context() as patched:
            costs = Costs(patched)
            toolset, specs, revision = client_tools_and_revision(session_id=session.pk)
        assert len(costs.statements) == 1, costs.statements
        assert toolset.tools == {"map_select": tool}
        assert revision == AnnotationRevision.state()
    assert revision[0] != ""
    client_tools_unregister(channel_name="specific.a")
    assert client_tools_and_revision(session_id=session.pk) == (None, specs.__class__(), None)
