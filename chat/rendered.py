"""Each stored message's HTML, cached: a page of a long session renders only what changed.

A message's HTML depends on more than its text: the answers to its questions and the
responses to its find-similar requests (written later, by the user), the questions a user's
answer picks from (asked earlier), the artifacts its `${…}` placeholders name, the data's
classes (a find-similar block without samples) and the markup code itself. The cache key is
the message id, the markup version (a digest of the code and templates that render markup,
so a deploy that changes them never serves an old rendering) and a digest of those inputs:
when any of them changes, so does the key, and the stale entry is never read again (it
expires). Nothing has to remember to invalidate.

The cache is Django's default: each process's memory, or Redis when `REDIS_URL` is set (then
shared by every process).
"""

import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.cache import cache as default_cache
from django.utils.safestring import SafeString, mark_safe

from .markup import Answer, QuestionBlock, Response, render_message

# A day: an entry whose inputs changed is unreachable and goes by itself.
TIMEOUT_SECONDS = 24 * 3600
_FIND_SIMILAR = 'type="find-similar"'


@cache
def markup_version() -> str:
    """A digest of everything that turns markup into HTML (chat/markup, the block templates
    and their tags, the words for classes), computed once per process."""
    root = Path(settings.BASE_DIR)
    files = sorted(
        [
            *(root / "chat" / "markup").glob("*.py"),
            *(root / "templates" / "chat" / "blocks").glob("*.html"),
            *(root / "chat" / "templatetags").glob("*.py"),
            root / "geosense" / "annotations" / "classes.py",
        ]
    )
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class MessageToRender:
    """One message and everything its HTML depends on."""

    id: int
    role: str
    text: str
    answers: Mapping[str, Answer]
    questions: Mapping[str, QuestionBlock]


def _key(
    item: MessageToRender,
    *,
    artifacts: Mapping[str, Any],
    responses: Mapping[str, Response],
    revision: Callable[[], str],
) -> str:
    find_similar = _FIND_SIMILAR in item.text
    inputs = repr(
        (
            item.role,
            item.text,
            sorted(item.answers.items()),
            sorted(item.questions.items()),
            # Artifacts are written once: which ones exist is enough.
            sorted(a for a in artifacts if f"${{{a}" in item.text),
            sorted(responses.items()) if find_similar else None,
            revision() if find_similar else None,
        )
    )
    digest = hashlib.sha256(inputs.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"message-html:{markup_version()}:{item.id}:{digest}"


def messages_html(
    items: Sequence[MessageToRender],
    *,
    artifacts: Mapping[str, Any],
    responses: Mapping[str, Response],
    classes: Collection[str],
    revision: Callable[[], str],
) -> dict[int, SafeString]:
    """message id → its HTML: from the cache when its inputs are unchanged, rendered (and
    cached) otherwise. `revision` is the annotations' revision (read only for a message with
    a find-similar block, whose rendering depends on the data's classes)."""
    keys = {
        item.id: _key(item, artifacts=artifacts, responses=responses, revision=revision)
        for item in items
    }
    found = default_cache.get_many(list(keys.values()))
    html: dict[int, SafeString] = {}
    missed: dict[str, str] = {}
    for item in items:
        cached = found.get(keys[item.id])
        if cached is not None:
            # Only this module writes these entries, each the output of render_message.
            html[item.id] = mark_safe(cached)
            continue
        html[item.id] = render_message(
            item.text,
            role=item.role,
            artifacts=artifacts,
            answers=item.answers,
            responses=responses,
            questions=item.questions,
            message_id=item.id,
            classes=classes,
        )
        missed[keys[item.id]] = str(html[item.id])
    if missed:
        default_cache.set_many(missed, timeout=TIMEOUT_SECONDS)
    return html
