"""JSON Schema checks shared by backend tools, client tools and their results."""

import json
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

FORBIDDEN_SCHEMA_KEYS = frozenset({"pattern", "patternProperties"})


class SchemaRefused(ValueError):
    """A declared schema is not acceptable; the message says why, for the declarer."""


def _forbidden_key_path(node: Any, path: str = "") -> str | None:
    if isinstance(node, Mapping):
        for key, value in node.items():
            here = f"{path}/{key}"
            if key in FORBIDDEN_SCHEMA_KEYS:
                return here
            found = _forbidden_key_path(value, here)
            if found:
                return found
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found = _forbidden_key_path(value, f"{path}/{index}")
            if found:
                return found
    return None


def schema_check(schema: Any, *, what: str = "schema") -> None:
    """Refuse a schema that is not a valid JSON Schema object or uses `pattern` anywhere.

    `pattern`/`patternProperties` are refused at any depth (client-tools reference): regular
    expression dialects differ between validators, so a check must live in the handler.
    """
    if not isinstance(schema, Mapping):
        raise SchemaRefused(f"{what} must be a JSON Schema object")
    found = _forbidden_key_path(schema)
    if found:
        raise SchemaRefused(
            f"{what} uses {found.rsplit('/', 1)[-1]!r} at {found}; pattern and patternProperties are not allowed"
        )
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise SchemaRefused(f"{what} is not a valid JSON Schema: {exc.message}") from None


def validation_error(*, schema: Mapping[str, Any], value: Any) -> str | None:
    """A readable sentence naming the first problems of `value`, or None when it is valid."""
    validator = Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    parts = []
    for error in errors[:3]:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        parts.append(f"{where}: {error.message}")
    return "; ".join(parts)


def arguments_decode(raw: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """The model's arguments as an object; raises ValueError with a readable reason."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"the arguments are not valid JSON ({exc.msg} at position {exc.pos})"
        ) from None
    if not isinstance(value, dict):
        raise ValueError("the arguments must be a JSON object")
    return value
