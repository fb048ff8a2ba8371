"""The map's picture reaches the `openai` agent as an image part when the model takes images, as
words otherwise, and a server that refuses images is asked again once with words."""

import json

import pytest
from asgiref.sync import sync_to_async

from chat.agents import openai as openai_agent_module
from chat.agents.prompts import system_prompt
from chat.models import Artifact
from tests.chat.helpers import post_stream

PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4"
    "DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
)
IMAGE = {"type": "image", "data": {"png": PNG, "width": 800, "height": 600}}
LLAMA_REFUSAL = (
    "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"
)


@pytest.fixture(autouse=True)
def no_refusal_remembered():
    openai_agent_module._images_refused.clear()
    yield
    openai_agent_module._images_refused.clear()


async def ask(client, caller, text: str = "what is this?", contexts=(IMAGE,)):
    return await post_stream(
        client,
        caller.url("/message/stream"),
        {"text": text, "contexts": list(contexts)},
        token=caller.token,
    )


async def image_artifact_id(session) -> str:
    @sync_to_async
    def read() -> str:
        (artifact_id,) = Artifact.objects.filter(session=session, kind="image").values_list(
            "artifact_id", flat=True
        )
        return artifact_id

    return await read()


def described(artifact_id: str, text: str = "what is this?") -> str:
    return (
        f'{text}\n[context type="image" artifact_id="{artifact_id}"] '
        "A picture of the map as the user saw it, 800×600 px."
    )


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_picture_goes_to_a_vision_model_as_an_image_part(
    client, trusted_caller, openai_agent
):
    out = await ask(client, trusted_caller)

    assert out.status == 200
    artifact_id = await image_artifact_id(trusted_caller.session)
    (request,) = openai_agent.requests
    assert request["messages"] == [
        {"role": "system", "content": system_prompt(overview={})},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": described(artifact_id)},
                {"type": "image_url", "image_url": {"url": PNG}},
            ],
        },
    ]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_without_vision_the_picture_is_words_never_base64(
    client, trusted_caller, openai_agent, settings
):
    settings.GEOSENSE_LLM_VISION = False

    await ask(client, trusted_caller)

    artifact_id = await image_artifact_id(trusted_caller.session)
    (request,) = openai_agent.requests
    assert request["messages"][1] == {"role": "user", "content": described(artifact_id)}
    assert "base64" not in json.dumps(request)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_server_that_refuses_images_is_asked_once_more_in_words_and_remembered(
    client, trusted_caller, openai_agent
):
    openai_agent.fail(400, message=LLAMA_REFUSAL)
    openai_agent.reply_text("A map of houses.")

    out = await ask(client, trusted_caller)

    assert out.of("error") == []
    assert out.message["content"] == "A map of houses."
    artifact_id = await image_artifact_id(trusted_caller.session)
    refused, retried = openai_agent.requests
    assert refused["messages"][1]["content"][1]["type"] == "image_url"
    assert retried == {
        **refused,
        "messages": [
            refused["messages"][0],
            {"role": "user", "content": described(artifact_id)},
        ],
    }

    openai_agent.requests.clear()
    await ask(client, trusted_caller, text="and now?")

    (later,) = openai_agent.requests
    assert "base64" not in json.dumps(later)
    assert later["messages"][-1]["content"].startswith('and now?\n[context type="image"')


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_refusal_about_something_else_is_not_retried(client, trusted_caller, openai_agent):
    openai_agent.fail(400, message="max_tokens is too large")

    out = await ask(client, trusted_caller)

    assert len(openai_agent.requests) == 1
    assert out.of("error") == [
        {
            "message": "The assistant could not answer. The language model server answered "
            "HTTP 400. max_tokens is too large"
        }
    ]
    assert openai_agent_module._images_refused == set()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_refusal_naming_images_when_none_were_sent_is_an_error(
    client, trusted_caller, openai_agent
):
    openai_agent.fail(400, message=LLAMA_REFUSAL)

    out = await ask(client, trusted_caller, contexts=())

    assert len(openai_agent.requests) == 1
    assert len(out.of("error")) == 1
    assert openai_agent_module._images_refused == set()


def test_whether_pictures_go_as_images_is_one_python_call_while_no_server_refused_one():
    """Asked at every step: the configuration's key (a tuple, a property of its own) is only
    made when some server of this process refused an image (2 Python calls before)."""
    from chat.agents.openai import OpenAIAgent, ProviderConfig
    from tests.chat.costs import python_calls_of

    agent = OpenAIAgent(ProviderConfig(base_url="http://model.invalid/v1"))
    assert agent.accepts_images
    assert python_calls_of(lambda: agent.accepts_images) == 2  # the lambda's and the property's
    openai_agent_module._images_refused.add((agent.config.base_url, agent.config.model))
    assert not agent.accepts_images
