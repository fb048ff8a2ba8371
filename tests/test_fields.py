"""The NUL-free model fields: what PostgreSQL refuses is stored the same way on every database."""

import pytest

from chat.models import Artifact, ChatSession, Message
from geosense.fields import NulFreeJSONField, nul_free


def test_nul_is_replaced_in_strings_keys_and_nested_values():
    assert nul_free({"a\x00": ["b\x00", {"c": "d\x00"}, 3, None]}) == {
        "a\ufffd": ["b\ufffd", {"c": "d\ufffd"}, 3, None]
    }


def test_a_json_value_without_nul_is_handed_on_as_it_is():
    value = {"ids": list(range(1000)), "text": "a\\u0000 literally"}
    assert NulFreeJSONField().get_prep_value(value) == value
    clean = {"ids": [1, 2]}
    assert NulFreeJSONField().get_prep_value(clean) is clean


@pytest.mark.django_db
def test_a_message_and_an_artifact_with_nul_are_stored_with_the_replacement_character(
    django_user_model,
):
    session = ChatSession.objects.create(user=django_user_model.objects.create(username="u"))
    message = Message.objects.create(
        session=session, role="user", content="a\x00b", tool_calls=[{"id": "c\x00"}]
    )
    Artifact.objects.create(
        session=session, artifact_id="x", kind="position", data={"k\x00": "v\x00"}, origin="t"
    )
    Message.objects.filter(pk=message.pk).update(content="updated\x00")

    message.refresh_from_db()
    assert (message.content, message.tool_calls) == ("updated\ufffd", [{"id": "c\ufffd"}])
    assert Artifact.objects.get().data == {"k\ufffd": "v\ufffd"}
