"""Model fields for text that comes from outside: users, models, browsers, imports.

PostgreSQL refuses the NUL character in `text` and `varchar` values and in `jsonb` strings and
keys ("unsupported Unicode escape sequence"); SQLite stores it. Models and browsers do send it
now and then, and a NUL never means anything GeoSense keeps, so these fields replace it with
U+FFFD (the replacement character) on the way in, on every database alike: a message with a NUL
in it is stored, shown and re-fed the same way everywhere instead of failing on PostgreSQL.
"""

import json
from typing import Any

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


class NulFreeTextField(models.TextField):
    def get_prep_value(self, value: Any) -> Any:
        return nul_free(super().get_prep_value(value))


class NulFreeCharField(models.CharField):
    def get_prep_value(self, value: Any) -> Any:
        return nul_free(super().get_prep_value(value))


class NulFreeJSONField(models.JSONField):
    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        if not isinstance(value, dict | list | str):  # None, numbers, expressions
            return value
        # Serialising in C finds a NUL far faster than walking a large value in Python; only a
        # value that has one (or a literal backslash-u0000) is walked.
        if "\\u0000" not in json.dumps(value, cls=self.encoder):
            return value
        return nul_free(value)
