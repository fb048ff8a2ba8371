"""Markdown in assistant text: CommonMark with GFM tables and strikethrough, with the GeoSense
elements inside it, rendered on the server and sanitised.

How elements and Markdown meet: the prose of a run of inline parts is Markdown source; every
other part (a chip, a value, `<b>…</b>`, an interpolated value, an error chip) stands in the
source as an opaque token (private-use sentinels around its number), so Markdown structure
spans elements (`**<ref id="3"/>**`, a list item or a table cell holding a `<distance>`). After
parsing, a core rule turns each token in text back into its element's HTML, and into the
element's source text inside code, where nothing is interpreted.

Safety, in layers: markdown-it runs with raw HTML off (a tag that is not GeoSense's own is text);
links and autolinks are http/https only (others stay text) and images become links; table
alignment is a class, not a `style` attribute; and Markdown's HTML passes `nh3` with an allowlist
of tags and attributes, http/https URLs only, and `rel="noopener noreferrer nofollow"` with
`target="_blank"` on every link. Only then are the elements (GeoSense's own HTML, built from
validated values with `format_html`) put in place of their tokens, which by then can stand only
in text: the core rule leaves no token in code, an attribute or a decoded entity.

While a message streams (`streaming=True`), half-open syntax stays text until it closes: an
unclosed code fence and what follows it show as plain text, and a last line that is still only
syntax (`-`, `|---`, `#`, `1.`, `===`) is held back, so nothing flips between two renderings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import nh3
from django.utils.html import escape
from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.token import Token

ELEMENT_OPEN = "\ue002"
ELEMENT_CLOSE = "\ue003"
_ELEMENT_RE = re.compile(f"{ELEMENT_OPEN}(\\d+){ELEMENT_CLOSE}")
_ENCODED_SENTINEL = "%EE%80%8"  # a sentinel inside a link destination, percent-encoded
_SAFE_URL_RE = re.compile(r"https?://", re.IGNORECASE)
_ALIGN_RE = re.compile(r"text-align:(left|center|right)")
_SYNTAX_ONLY_RE = re.compile(r"[ \t]*(?:>[ \t]*)*(?:[-*_=+#|:~`\t ]*|\d{1,9}[.)]?[ \t]*)")
# A character that may start inline Markdown syntax (or an entity, or a line break).
# A code fence's language becomes the class `language-<name>`: only a plain name does.
_LANGUAGE_RE = re.compile(r"[\w+#.-]{1,32}")
_INLINE_SYNTAX_RE = re.compile(r"[\\`*_\[\]<>!&~\n]|https?:")

ALLOWED_TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "s", "code", "pre",
    "blockquote", "ul", "ol", "li", "table", "thead", "tbody", "tr", "th", "td", "a",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title", "class"},
    "ol": {"start"},
    "code": {"class"},
    "th": {"class"},
    "td": {"class"},
    "p": {"class"},
}
LINK_REL = "noopener noreferrer nofollow"


@dataclass(frozen=True, slots=True)
class Element:
    """An element standing in Markdown source: its HTML, and its text where code shows it."""

    html: str
    source: str


def _link_allowed(url: str) -> bool:
    return bool(_SAFE_URL_RE.match(url)) and _ENCODED_SENTINEL not in url.upper()


def _elements_in_tokens(state: StateCore) -> None:
    """Core rule: element tokens in text become `geosense` tokens; in code and attributes,
    their source text."""
    elements: list[Element] = state.env.get("elements", [])
    for token in state.tokens:
        _attributes_as_source(token, elements)
        if token.type in ("fence", "code_block"):
            token.content = _as_source(token.content, elements)
            token.info = _fence_language(_as_source(token.info, elements))
        elif token.type in ("th_open", "td_open"):
            _align_as_class(token)
        elif token.type == "inline" and token.children:
            token.children = _inline_children(token.children, elements)


def _fence_language(info: str) -> str:
    """The fence's language name, or "" when its info string does not start with a plain name
    (it would land in a class attribute: `language-<javascript:…>`)."""
    words = info.split(maxsplit=1)
    return words[0] if words and _LANGUAGE_RE.fullmatch(words[0]) else ""


def _inline_children(children: list[Token], elements: list[Element]) -> list[Token]:
    out: list[Token] = []
    for child in children:
        if child.type == "text" and ELEMENT_OPEN in child.content:
            out.extend(_split_text(child, elements))
            continue
        if child.type == "text_special":  # an entity or escape decoded into a sentinel is text
            child.content = child.content.replace(ELEMENT_OPEN, "\ufffd").replace(
                ELEMENT_CLOSE, "\ufffd"
            )
        elif child.type == "code_inline":
            child.content = _as_source(child.content, elements)
        elif child.type == "image" and child.children:
            child.children = _inline_children(child.children, elements)
        _attributes_as_source(child, elements)
        out.append(child)
    return out


def _attributes_as_source(token: Token, elements: Sequence[Element]) -> None:
    for name, value in list(token.attrs.items()):
        if isinstance(value, str) and ELEMENT_OPEN in value:
            token.attrSet(name, _as_source(value, elements).replace(ELEMENT_OPEN, "\ufffd"))


def _split_text(token: Token, elements: list[Element]) -> list[Token]:
    out: list[Token] = []
    position = 0
    for match in _ELEMENT_RE.finditer(token.content):
        if match.start() > position:
            out.append(_text_token(token, token.content[position : match.start()]))
        number = int(match.group(1))
        if number < len(elements):
            element = Token("geosense", "", 0)
            element.meta = {"n": number}
            out.append(element)
        position = match.end()
    if position < len(token.content):
        out.append(_text_token(token, token.content[position:]))
    return out


def _text_token(like: Token, content: str) -> Token:
    token = Token("text", "", 0)
    token.content = content.replace(ELEMENT_OPEN, "\ufffd").replace(ELEMENT_CLOSE, "\ufffd")
    token.level = like.level
    return token


def _as_source(text: str, elements: Sequence[Element]) -> str:
    if ELEMENT_OPEN not in text:
        return text

    def source(match: re.Match[str]) -> str:
        number = int(match.group(1))
        return elements[number].source if number < len(elements) else "\ufffd"

    return _ELEMENT_RE.sub(source, text)


def _align_as_class(token: Token) -> None:
    """GFM alignment as a class: a `style` attribute would need 'unsafe-inline' in a CSP."""
    style = token.attrGet("style")
    if style is None:
        return
    token.attrs.pop("style", None)
    match = _ALIGN_RE.search(str(style))
    if match:
        token.attrSet("class", f"align-{match.group(1)}")


def _render_element(self: Any, tokens: list[Token], idx: int, options: Any, env: Any) -> str:
    """The element's token, put back into text: it is replaced after sanitising."""
    return f"{ELEMENT_OPEN}{tokens[idx].meta['n']}{ELEMENT_CLOSE}"


def _render_image(self: Any, tokens: list[Token], idx: int, options: Any, env: Any) -> str:
    """An image from the model is a link to it, never loaded by the page."""
    token = tokens[idx]
    src = escape(str(token.attrGet("src") or ""))
    label = self.renderInline(token.children or [], options, env) or src
    return f'<a href="{src}" class="image-link">{label}</a>'


@cache
def _parser() -> MarkdownIt:
    md = MarkdownIt(
        "commonmark", {"html": False, "breaks": True, "linkify": False, "typographer": False}
    ).enable(["table", "strikethrough"])
    md.validateLink = _link_allowed
    md.core.ruler.after("inline", "geosense_elements", _elements_in_tokens)
    md.add_render_rule("geosense", _render_element)
    md.add_render_rule("image", _render_image)
    return md


def _sanitised(html: str) -> str:
    return nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes={"http", "https"},
        link_rel=LINK_REL,
        set_tag_attribute_values={"a": {"target": "_blank"}},
        strip_comments=True,
    )


def markdown_html(
    pieces: Sequence[str | Element],
    *,
    inline: bool = False,
    streaming: bool = False,
    line_complete: bool = False,
) -> str:
    """Sanitised HTML of Markdown source pieces (`str`) and elements, in order.

    `inline` renders inline syntax only (headers, option labels, tool bodies: places where a
    paragraph or a list cannot stand); `streaming` holds back half-open syntax at the end, and
    `line_complete` says the streamed text so far ends with a line break.
    """
    elements: list[Element] = []
    source: list[str] = []
    for piece in pieces:
        if isinstance(piece, Element):
            source.append(f"{ELEMENT_OPEN}{len(elements)}{ELEMENT_CLOSE}")
            elements.append(piece)
        else:
            source.append(piece)
    text = "".join(source)
    if inline and not _INLINE_SYNTAX_RE.search(text):
        # Plain words (an option label, a header): no Markdown to parse, nothing to sanitise
        # beyond escaping, and the elements' HTML is GeoSense's own.
        return "".join(escape(p) if isinstance(p, str) else p.html for p in pieces)
    env = {"elements": elements}
    md = _parser()
    if inline:
        return _with_elements(_sanitised(md.renderInline(text, env)), elements)
    tail = ""
    if streaming:
        text, tail = _streaming_split(text + "\n" if line_complete else text)
    html = md.render(text, env)
    if tail:
        shown = escape(_as_source(tail, elements)).replace("\n", "<br>")
        html += f'<p class="markdown-pending">{shown}</p>'
    return _with_elements(_sanitised(html), elements)


def _with_elements(html: str, elements: Sequence[Element]) -> str:
    if ELEMENT_OPEN not in html:
        return html
    return _ELEMENT_RE.sub(lambda m: elements[int(m.group(1))].html, html)


def _streaming_split(text: str) -> tuple[str, str]:
    """(Markdown to render now, text to show as it is) for a message still being written."""
    last_break = text.rfind("\n")
    if _SYNTAX_ONLY_RE.fullmatch(text[last_break + 1 :]):
        text = text[: last_break + 1]
    if "```" not in text and "~~~" not in text:
        return text, ""
    lines = text.split("\n")
    fences = [t for t in _parser().parse(text) if t.type == "fence" and t.map]
    if not fences:
        return text, ""
    start, end = fences[-1].map
    closing = lines[end - 1] if end - 1 > start else ""
    marker = fences[-1].markup
    if closing.strip().startswith(marker) and set(closing.strip()) == {marker[0]}:
        return text, ""
    return "\n".join(lines[:start]) + "\n", "\n".join(lines[start:]).rstrip("\n")


def markdown_plain(text: str) -> str:
    """Markdown source as plain text, syntax dropped (titles, previews, default option messages)."""
    out: list[str] = []
    for token in _parser().parseInline(text, {"elements": []})[0].children or []:
        if token.type in ("text", "code_inline", "text_special"):
            out.append(token.content)
        elif token.type in ("softbreak", "hardbreak"):
            out.append(" ")
        elif token.type == "image":
            out.extend(c.content for c in token.children or [])
    return "".join(out)


def render_with(
    parts: Sequence[Any],
    *,
    is_markdown: Callable[[Any], bool],
    element: Callable[[Any], Element],
    inline: bool,
    streaming: bool = False,
) -> str:
    """`markdown_html` over inline parts: Markdown parts by their text, the rest as elements."""
    return markdown_html(
        [p.text if is_markdown(p) else element(p) for p in parts],
        inline=inline,
        streaming=streaming,
    )
