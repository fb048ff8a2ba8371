"""What a user message shared shows in the transcript; a picture as a thumbnail served from its
one stored artifact, to its owner only."""

import base64
import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from chat import services
from chat.models import Artifact, ChatSession, Message

pytestmark = pytest.mark.django_db

PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
)
PNG = "data:image/png;base64," + base64.b64encode(PIXEL).decode()


def login(name: str) -> tuple[Client, ChatSession]:
    user = get_user_model().objects.create_user(username=name, password="pw")
    client = Client()
    client.force_login(user)
    return client, ChatSession.objects.create(user=user)


def shared_turn(session: ChatSession, png=PNG) -> str:
    message = services.message_store(
        session_id=session.pk, turn=1, role=Message.Role.USER, content="Allow"
    )
    services.artifact_save(
        session_id=session.pk,
        kind="position",
        data={"zoom": 17},
        origin="client:position",
        message_id=message.pk,
    )
    return services.artifact_save(
        session_id=session.pk,
        kind="image",
        data={"png": png, "width": 800, "height": 600},
        origin="client:image",
        message_id=message.pk,
    )


def test_the_users_message_shows_what_it_shared_with_a_thumbnail_of_the_picture():
    client, session = login("alice")
    artifact_id = shared_turn(session)

    html = client.get(f"/chat/{session.pk}/turns/1/").content.decode()

    url = f"/chat/{session.pk}/pictures/{artifact_id}/"
    shared = re.search(r'<ul class="message-shared".*?</ul>', html, re.S).group(0)
    assert 'data-context="position"' in shared and "Map position" in shared
    assert (
        f'<img src="{url}" alt="Picture of the map shared with the assistant" '
        'width="96" height="72" loading="lazy">'
    ) in shared
    assert "base64" not in html
    assert Artifact.objects.filter(session=session, kind="image").count() == 1

    picture = client.get(url)
    assert picture.status_code == 200
    assert picture["Content-Type"] == "image/png"
    assert picture.content == PIXEL


def test_another_user_gets_404_for_the_picture():
    _, session = login("alice")
    artifact_id = shared_turn(session)
    stranger, _ = login("mallory")

    assert stranger.get(f"/chat/{session.pk}/pictures/{artifact_id}/").status_code == 404
    assert Client().get(f"/chat/{session.pk}/pictures/{artifact_id}/").status_code == 302


@pytest.mark.parametrize(
    "png", ["data:image/svg+xml;base64,PHN2Zy8+", "data:text/html;base64,PGgxPg==", "x", None]
)
def test_only_png_jpeg_or_webp_pictures_are_served(png):
    client, session = login("alice")
    artifact_id = shared_turn(session, png=png)

    assert client.get(f"/chat/{session.pk}/pictures/{artifact_id}/").status_code == 404


def test_a_context_that_is_not_a_picture_is_not_served_as_one():
    client, session = login("alice")
    shared_turn(session)
    (position,) = Artifact.objects.filter(session=session, kind="position")

    assert client.get(f"/chat/{session.pk}/pictures/{position.artifact_id}/").status_code == 404


def test_the_chips_say_what_exactly_was_shared():
    from chat.selectors import shared_contexts

    _, session = login("carol")
    message = services.message_store(
        session_id=session.pk, turn=1, role=Message.Role.USER, content="Allow"
    )
    for kind, data in (
        ("visibility", {"classes": ["house", "pool", "tree"], "hidden": ["shed"]}),
        ("position", {"center": {"lat": 34.16123456, "lon": -118.5}, "zoom": 16.44}),
        ("selection", {"ids": list(range(1, 1201))}),
        ("position", {"zoom": "near"}),  # the page's data, whatever it holds: no detail
    ):
        services.artifact_save(
            session_id=session.pk,
            kind=kind,
            data=data,
            origin=f"client:{kind}",
            message_id=message.pk,
        )

    shown = shared_contexts(session_id=session.pk, message_ids=[message.pk])[message.pk]

    assert [(c.label, c.detail, c.title) for c in shown] == [
        ("Visible classes", "3", "Shown: house, pool, tree"),
        ("Map position", "zoom 16", "Zoom 16.4, centre 34.16123, -118.50000"),
        ("Selected annotations", "1,200", ""),
        ("Map position", "", ""),
    ]
