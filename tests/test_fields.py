"""The NUL-free model fields: what PostgreSQL refuses is stored the same way on every database."""

import datetime
import json

import pytest

from chat.models import Artifact, ChatSession, Message
from geosense.fields import NulFreeJSONField, json_text, nul_free


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


@pytest.mark.django_db
def test_a_saved_message_holds_what_was_stored(django_user_model):
    """A turn's final answer is serialised from the saved object (not read again): on
    PostgreSQL the answer streamed with its NUL while the transcript had the replacement."""
    session = ChatSession.objects.create(user=django_user_model.objects.create(username="u"))
    message = Message.objects.create(session=session, role="assistant", content="Found\x00 you.")
    assert message.content == "Found\ufffd you."
    message.content = "again\x00"
    message.save(update_fields=["content"])
    assert message.content == "again\ufffd"


def test_json_text_reads_back_as_json_dumps_would_write_it():
    from enum import StrEnum

    class Colour(StrEnum):  # a str subclass, as model choices are: orjson hands it back
        RED = "red"

    values = [
        {"ids": list(range(50)), "values": [0.1, 12.35, 1e16, -0.0], "text": "Zürich ✓ \u2028"},
        {1: "int keys", "nested": [{"a": None, "b": True}]},
        [2**70, "big integers"],
        {"choice": Colour.RED, "tuple": (1, 2)},
        "a\\u0000 literally",
    ]
    for value in values:
        assert json.loads(json_text(value)) == json.loads(json.dumps(value))


def test_json_text_refuses_what_json_dumps_refuses():
    with pytest.raises(TypeError):
        json_text({"when": datetime.datetime(2026, 12, 1)})


@pytest.mark.django_db
def test_an_artifact_is_stored_as_json_text_once_and_nan_as_null(django_user_model, monkeypatch):
    """A large artifact (a tool's 400,000 pairs) is serialised once on save, not once for the
    NUL check and again for the database; NaN, which PostgreSQL's jsonb refuses, is null."""
    from geosense import fields

    calls = []
    real = fields.json_text
    monkeypatch.setattr(fields, "json_text", lambda *a, **k: calls.append(1) or real(*a, **k))
    session = ChatSession.objects.create(user=django_user_model.objects.create(username="u"))
    data = {"ids": [3, 1, 2], "linkValues": [0.5, float("nan")], "label": "Zürich"}
    Artifact.objects.create(
        session=session, artifact_id="x", kind="highlight", data=data, origin="t"
    )

    assert len(calls) == 1
    assert Artifact.objects.get().data == {
        "ids": [3, 1, 2],
        "linkValues": [0.5, None],
        "label": "Zürich",
    }


def test_numpy_columns_are_written_as_their_lists_would_be():
    """Tools keep large answers' columns as arrays: the JSON is the same text as their lists'."""
    import numpy as np

    columns = {
        "ids": np.array([3, 1, 2**40, -7], dtype=np.int64),
        "values": np.round(np.array([0.125, 12.345, 1e-7, 0.0, 1e15, 2.5, 1 / 3]), 2),
        "shares": np.array([round(1 / 3, 4), 1.0, 5e-5]),
        "empty": np.zeros(0),
        "nested": [{"id": np.array([1, 2])}],
    }
    as_lists = {
        "ids": columns["ids"].tolist(),
        "values": columns["values"].tolist(),
        "shares": columns["shares"].tolist(),
        "empty": [],
        "nested": [{"id": [1, 2]}],
    }

    assert json_text(columns) == json_text(as_lists)
    assert json.loads(json_text(columns)) == json.loads(json.dumps(as_lists))


@pytest.mark.django_db
def test_an_artifact_of_numpy_columns_reads_back_as_lists(django_user_model):
    import numpy as np

    session = ChatSession.objects.create(user=django_user_model.objects.create(username="u"))
    data = {"ids": np.array([5, 4], dtype=np.int64), "areas": np.array([1.25, 0.0])}
    Artifact.objects.create(
        session=session, artifact_id="x", kind="highlight", data=data, origin="t"
    )

    assert Artifact.objects.get().data == {"ids": [5, 4], "areas": [1.25, 0.0]}
