"""Library sources GeoSense stands in for or relies on, pinned by a digest of their text: a
lock bump that changes one fails the test that pins it, and its stand-in is read again."""

import hashlib
import inspect
from typing import Any


def source_digests(originals: dict[str, Any]) -> dict[str, str]:
    """Each object's source text, as the first 16 hex digits of its SHA-256."""
    return {
        name: hashlib.sha256(inspect.getsource(original).encode()).hexdigest()[:16]
        for name, original in originals.items()
    }
