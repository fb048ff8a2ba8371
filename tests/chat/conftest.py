"""Fixtures for the chat tests: a user with a bearer token, a session, a seeded neighbourhood."""

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import AsyncClient

from chat.agents import agents_close
from chat.models import ChatSession
from geosense.accounts.services import api_token_create, credit_set
from geosense.annotations.services import demo_seed
from tests.wire_shapes import server_frame_problem


@dataclass
class Caller:
    user: object
    token: str
    session: ChatSession

    def url(self, suffix: str = "") -> str:
        return f"/api/sessions/{self.session.pk}{suffix}"


def make_caller(
    username: str, *, credits: int = 100, allow_backend_tools: bool = False, curator: bool = False
) -> Caller:
    """A user with a token and a session; a curator may delete annotations."""
    user = get_user_model().objects.create_user(username=username, password="pw-" + username)
    if curator:
        user.user_permissions.add(
            Permission.objects.get(
                content_type__app_label="annotations", codename="delete_annotation"
            )
        )
    credit_set(user=user, balance=credits)
    session = ChatSession.objects.create(user=user, allow_backend_tools=allow_backend_tools)
    return Caller(user=user, token=api_token_create(user=user), session=session)


@pytest.fixture
def neighbourhood(transactional_db) -> None:
    demo_seed(annotations=400, seed=7)


@pytest.fixture
def caller(transactional_db) -> Caller:
    return make_caller("alice")


@pytest.fixture
def trusted_caller(transactional_db) -> Caller:
    """A caller whose session already allows backend tools (no backend-access approval), and
    a curator of the shared dataset (may delete annotations)."""
    return make_caller("bob", allow_backend_tools=True, curator=True)


@pytest.fixture
def client() -> AsyncClient:
    return AsyncClient()


@pytest_asyncio.fixture
async def openai_agent(settings, fake_llm) -> AsyncIterator[object]:
    """The openai agent on the fake model; the model client the test's loop built is closed
    after it, as Daphne closes its own at shutdown (aiohttp reports a session left open)."""
    settings.GEOSENSE_AGENT = "openai"
    settings.GEOSENSE_LLM_BASE_URL = fake_llm.base_url
    settings.GEOSENSE_LLM_MODEL = "fake-model"
    yield fake_llm
    await agents_close()


@pytest.fixture(autouse=True)
def frames_have_their_wire_shape(monkeypatch):
    """Every frame a test receives from the socket must have its shape in `geosense.wire`."""
    receive = WebsocketCommunicator.receive_json_from

    async def checked(self, *args, **kwargs):
        frame = await receive(self, *args, **kwargs)
        problem = server_frame_problem(frame)
        assert problem is None, f"the socket sent a malformed frame: {problem}"
        return frame

    monkeypatch.setattr(WebsocketCommunicator, "receive_json_from", checked)
