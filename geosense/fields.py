"""Model fields for text that comes from outside: users, models, browsers, imports.

PostgreSQL refuses the NUL character in `text` and `varchar` values and in `jsonb` strings and
keys ("unsupported Unicode escape sequence"); SQLite stores it. Models and browsers do send it
now and then, and a NUL never means anything GeoSense keeps, so these fields replace it with
U+FFFD (the replacement character) on the way in, on every database alike: a message with a NUL
in it is stored, shown and re-fed the same way everywhere instead of failing on PostgreSQL.
"""

import json
from typing import Any

import orjson
from django.db import models

NUL = "\x00"
REPLACEMENT = "\ufffd"


def nul_free(value: Any) -> Any:
    """`value` with every NUL in its strings (and JSON object keys) replaced."""
    if isinstance(value, str):
        return value.replace(NUL, REPLACEMENT)
    if isinstance(value, dict):
        return {nul_free(k): nul_free(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [nul_free(item) for item in value]
    return value


class _NulFreeString:
    """Text with its NULs replaced on the way in, and on the instance saved too: what is
    serialised from the object after its save (a turn's final answer sent as it was stored)
    must be what the database holds, not the NUL it never got."""

    def get_prep_value(self, value: Any) -> Any:
        return nul_free(super().get_prep_value(value))

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        value = super().pre_save(model_instance, add)
        if isinstance(value, str) and NUL in value:
            value = nul_free(value)
            setattr(model_instance, self.attname, value)
        return value


class NulFreeTextField(_NulFreeString, models.TextField):
    pass


class NulFreeCharField(_NulFreeString, models.CharField):
    pass


# What orjson would write differently from `json.dumps` (datetimes, dataclasses, str subclasses
# such as choices) it hands back as unsupported: those values, int keys and integers over 64
# bits go through `json.dumps` as before. numpy arrays, which `json.dumps` refuses, orjson writes
# as their `tolist()` would be written, without making the lists: tools keep the columns of
# large answers as arrays (a million annotations' within-distance artifact: ~15 instead of ~75
# ms). An array orjson cannot write (not C-contiguous, an unsupported dtype) is refused as before.
_ORJSON_STRICT = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_SERIALIZE_NUMPY
)


def json_text(value: Any, encoder: type[json.JSONEncoder] | None = None) -> str:
    """`value` as JSON text, as `json.dumps` reads it back, in C where it can be.

    orjson writes a tool's answer of 400,000 pairs (four columns, 10 MB) in ~30 ms where
    `json.dumps` takes ~230 ms. It writes non-ASCII as UTF-8 rather than escapes, without
    spaces, and NaN or infinity as null (PostgreSQL's jsonb refuses them anyway).
    """
    if encoder is None:
        try:
            return orjson.dumps(value, option=_ORJSON_STRICT).decode()
        except orjson.JSONEncodeError:
            pass
    return json.dumps(value, cls=encoder)


def json_nul_free(value: Any, encoder: type[json.JSONEncoder] | None = None) -> Any:
    """A JSON value as `NulFreeJSONField` stores it: `value` itself when it holds no NUL.
    Serialising in C finds a NUL far faster than walking a large value in Python; only a value
    that has one (or a literal backslash-u0000) is walked."""
    if "\\u0000" not in json_text(value, encoder):
        return value
    return nul_free(value)


class NulFreeJSONField(models.JSONField):
    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        if not isinstance(value, dict | list | str):  # None, numbers, expressions
            return value
        return json_nul_free(value, self.encoder)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        """A dict or list being saved is serialised once, the text both checked for NUL and
        stored (Django's own path serialises it again after the check)."""
        if prepared or not isinstance(value, dict | list):
            return super().get_db_prep_value(value, connection, prepared)
        text = json_text(value, self.encoder)
        if "\\u0000" in text:
            value = nul_free(value)
            text = json_text(value, self.encoder)
        if connection.vendor == "postgresql":
            from django.db.backends.postgresql.psycopg_any import Jsonb

            return Jsonb(value, dumps=lambda _value: text)
        return text
