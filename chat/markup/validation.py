"""Strict checks of the tool payloads against their type contracts (docs/markup.md).

Each check returns None for a valid payload or a short reason a person can read in the error
chip's tooltip. Checks over the per-id arrays use C-level builtins (`set(map(type, …))`,
`min`, `max`, `sum`) so a 100,000-id payload validates in a few milliseconds.
"""

from __future__ import annotations

import math
from typing import Any

from geosense.annotations.types import SIMILAR_SAMPLES_MAX

from .blocks import ATTRIBUTE_TYPES

MAX_IDS = 100_000
MAX_ID = 2**63 - 1
# One limit end to end: a block holds no more samples than its button's search takes.
MAX_SAMPLES = SIMILAR_SAMPLES_MAX
MAX_HINT = 200
MAX_VECTOR_NAME = 128
LINK_TYPES = ("distance", "overlap")


def _ints(values: list[Any]) -> bool:
    """Annotation ids: integers (not booleans) that fit a database key."""
    return not values or (
        set(map(type, values)) <= {int} and min(values) >= 0 and max(values) <= MAX_ID
    )


def _numbers(values: list[Any]) -> bool:
    """Finite numbers: a finite sum proves every term finite; otherwise check one by one."""
    if not values:
        return True
    if not set(map(type, values)) <= {int, float}:
        return False
    try:
        return math.isfinite(sum(values)) or all(map(math.isfinite, values))
    except OverflowError:
        return False


def highlight_problem(data: Any) -> str | None:
    """Check `HighlightToolData`: simple, distance-linked or overlap-linked."""
    if not isinstance(data, dict):
        return "data must be a JSON object"
    ids = data.get("ids")
    if not isinstance(ids, list):
        return "ids must be a list of annotation ids"
    if len(ids) > MAX_IDS:
        return f"too many ids ({len(ids):,}; at most {MAX_IDS:,})"
    if not _ints(ids):
        return "ids must be non-negative integers"
    links, link_type, values = data.get("links"), data.get("linkType"), data.get("linkValues")
    if links is None:
        if link_type is not None or values is not None:
            return "linkType and linkValues need links"
    else:
        if not isinstance(links, list) or len(links) != len(ids) or not _ints(links):
            return "links must be annotation ids, one per id"
        if link_type not in LINK_TYPES:
            return "linkType must be 'distance' or 'overlap'"
        if values is not None:
            if not isinstance(values, list) or len(values) != len(ids) or not _numbers(values):
                return "linkValues must be numbers, one per id"
            if values and min(values) < 0:
                return "linkValues must not be negative"
            if link_type == "overlap" and values and max(values) > 1:
                return "overlap linkValues are fractions between 0 and 1"
    hints = data.get("attributeHints")
    if hints is not None:
        if not isinstance(hints, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v in ATTRIBUTE_TYPES
            for k, v in hints.items()
        ):
            return "attributeHints must map names to " + ", ".join(sorted(ATTRIBUTE_TYPES))
        for name in hints:
            per_id = data.get(name)
            if isinstance(per_id, list) and len(per_id) != len(ids):
                return f"{name} must have one value per id"
    return None


def find_similar_problem(data: Any) -> str | None:
    """Check `FindSimilarToolData`: an optional hint and optional annotation samples."""
    if not isinstance(data, dict):
        return "data must be a JSON object"
    hint, samples = data.get("hint"), data.get("samples")
    if hint is not None and (not isinstance(hint, str) or len(hint) > MAX_HINT):
        return f"hint must be a text of at most {MAX_HINT} characters"
    if samples is not None:
        if not isinstance(samples, list):
            return "samples must be a list of annotations"
        if len(samples) > MAX_SAMPLES:
            return f"a search takes at most {MAX_SAMPLES} samples ({len(samples):,} given)"
        for sample in samples:
            if not isinstance(sample, dict) or type(sample.get("id")) is not int:
                return "each sample needs an integer id"
            if not 0 <= sample["id"] <= MAX_ID:
                return "sample ids must not be negative"
            vector = sample.get("v")
            if vector is not None and (
                not isinstance(vector, str) or not 0 < len(vector) <= MAX_VECTOR_NAME
            ):
                return "a sample's v must be a short text"
    if not hint and not samples:
        return "find-similar needs a hint or samples"
    return None
