"""Whatever a message says, its HTML holds only GeoSense's own elements: nothing runs."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat.markup import (
    Answer,
    answer_compose,
    message_plain_text,
    parse_message,
    render_message,
)

MARKDOWN_TAGS = {
    "h1", "h2", "h3", "h4", "h5", "h6", "hr", "strong", "em", "del", "s", "code", "pre",
    "blockquote", "ul", "ol", "li", "table", "thead", "tbody", "tr", "th", "td", "a",
}  # fmt: skip
# `form` and `input`: the free-text answer of an open question (fixed template markup).
ALLOWED_TAGS = {"div", "span", "button", "p", "b", "i", "br", "form", "input", *MARKDOWN_TAGS}
ALLOWED_ATTRIBUTES = {
    "class", "type", "title", "disabled", "role", "aria-pressed", "aria-busy",
    "href", "rel", "target", "start", "aria-label", "maxlength", "placeholder",
}  # fmt: skip
LINK_REL = "noopener noreferrer nofollow"
_TAG_IN_OUTPUT_RE = re.compile(r"<\s*(/?)\s*([^\s/>]*)")


class _Attributes(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    handle_startendtag = handle_starttag


def assert_inert(html: str) -> None:
    """Only our tags, only our attributes: no script, no handler, no URL, no comment."""
    for match in _TAG_IN_OUTPUT_RE.finditer(html):
        assert match.group(2).lower() in ALLOWED_TAGS, (match.group(0), html)
    parser = _Attributes()
    parser.feed(html)
    parser.close()
    for tag, attrs in parser.tags:
        assert tag in ALLOWED_TAGS
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            assert name in ALLOWED_ATTRIBUTES or re.fullmatch(r"data-[a-z-]+", name), (tag, name)
            if name not in ("title",) and not name.startswith("data-"):
                assert "javascript:" not in (value or "").lower(), (tag, name, value)
        if tag == "button":
            assert attrs["type"] in ("button", "submit")
        if tag == "form":
            assert attrs == {"class": "question-free-form"}, attrs  # no action, no method
        if tag == "a":
            assert re.match(r"https?://", attrs.get("href") or "http://"), attrs
            assert attrs.get("rel") == LINK_REL and attrs.get("target") == "_blank", attrs
        elif {"href", "rel", "target"} & set(attrs):
            raise AssertionError((tag, attrs))
        if tag == "ol":
            assert set(attrs) <= {"start"}
    # The only submit button is the free-text answer's, one per form.
    submits = sum(1 for tag, attrs in parser.tags if tag == "button" and attrs["type"] == "submit")
    assert submits == sum(1 for tag, _ in parser.tags if tag == "form")


NASTY_ARTIFACTS = {
    "evil": {
        "q": '" onclick="alert(1)" x="',
        "s": "'><script>alert(1)</script>",
        "html": "</div><img src=x onerror=alert(1)>",
        "js": "javascript:alert(1)",
        "svg": "<svg onload=alert(1)>",
        "ids": [1, 2],
        "nested": {"x": ["${evil.q}"]},
    },
    "hl": {"ids": [1], "note": "</div><script>alert(1)</script>", "x": "' onmouseover='alert(1)"},
}

FRAGMENTS = [
    '<question id="1">', "</question>", "<header>", "</header>",
    '<option message="', '" context="visibility">', "</option>", "<option>",
    "<tool type=\"highlight\" data='", '{"ids":[1,2]}', "'>", "</tool>",
    '<tool type="find-similar" data="${hl}">', '<tool type="highlight" data="${hl}">',
    '<ref id="', '"/>', "<id v=\"", "<id>", "</id>", '<size value="', '<distance value=4>',
    '<area id="${evil.ids.0}"/>', "<b>", "</b>", "<i>", "</i>",
    "${evil.q}", "${evil.s}", "${evil.html}", "${evil.js}", "${evil.svg}", "${evil.nested}",
    "${missing.path}", "${", "}", "$", "<answer question=\"1\" question-option-index=\"0\">",
    "</answer>", '<response type="find_similar" class-id="a" request="r">', "</response>",
    "<script>", "</script>", "<img src=x onerror=alert(1)>", "<svg onload=alert(1)>",
    '<a href="javascript:alert(1)">', "javascript:", " onclick=", "onerror=", "<!--", "-->",
    "<![CDATA[", "]]>", "<", ">", "/", '"', "'", "&", "&lt;", "&#x3c;", "&#60;", "&quot;",
    "\ue000", "\ue0010\ue001", "\x00", "\n", " ", "=", "<style>", "<iframe srcdoc='",
    # Markdown
    "**", "_", "`", "```", "\n```\n", "~~", "[", "](", ")", "![", "<http://a.b/>",
    "<javascript:alert(1)>", "](javascript:alert(1))", '](https://x.y "t")', "[r]: ", "[r]",
    "\n| a | b |\n|---|:-:|\n| 1 | 2 |\n", "\n- ", "\n1. ", "\n> ", "\n# ", "\n---\n",
    "&#xe002;0&#xe003;", "\ue0020\ue003", "\\", "    ", "<div>", "</div>",
]  # fmt: skip

markup_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=40).map(
    "".join
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=markup_text, streaming=st.booleans(), role=st.sampled_from(["assistant", "user"]))
def test_any_text_parses_and_renders_inert(text, streaming, role):
    parse_message(text, artifacts=NASTY_ARTIFACTS, role=role, streaming=streaming)
    html = render_message(
        text, role=role, artifacts=NASTY_ARTIFACTS, streaming=streaming, message_id="m1"
    )
    assert_inert(html)
    message_plain_text(text, role=role)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300))
def test_arbitrary_unicode_never_raises_and_renders_inert(text):
    assert_inert(render_message(text, role="assistant", artifacts=NASTY_ARTIFACTS))
    assert_inert(render_message(text, role="user", artifacts={}))


@settings(max_examples=200, deadline=None)
@given(
    question_id=st.text(min_size=1, max_size=64).filter(
        lambda s: s.strip() == s and s and not re.search(r"[\x00-\x1f\x7f\ue000-\ue003]", s)
    ),
    option_index=st.one_of(st.none(), st.integers(min_value=0, max_value=19)),
    message=st.text(max_size=200)
    .map(str.strip)
    # The markup's sentinels (U+E000 to U+E003) are scrubbed from user text by design.
    .filter(lambda s: not re.search(r"[\ue000-\ue003\r]", s)),
)
def test_composed_answers_parse_back_to_the_same_values(question_id, option_index, message):
    text = answer_compose(question_id=question_id, option_index=option_index, message=message)
    assert parse_message(text, artifacts={}, role="user") == [
        Answer(question_id=question_id, option_index=option_index, message=message)
    ]
    assert_inert(render_message(text, role="user", artifacts={}))


# --- known payloads (OWASP XSS filter-evasion kinds) -----------------------------------------
XSS_PAYLOADS = [
    # tags
    "<script>alert(1)</script>",
    "<ScRiPt>alert(1)</sCrIpT>",
    "<scr<script>ipt>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "<body onload=alert(1)>",
    '<iframe src="javascript:alert(1)"></iframe>',
    "<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>",
    "<!--<img src=x onerror=alert(1)>-->",
    "&lt;script&gt;alert(1)&lt;/script&gt;",
    "&#60;script&#62;alert(1)&#60;/script&#62;",
    # attributes on GeoSense's own tags
    '<ref id="1" onclick="alert(1)"/>',
    "<b onmouseover=alert(1)>bold</b>",
    '<i style="background:url(javascript:alert(1))">x</i>',
    '<size value="3" onfocus="alert(1)" autofocus/>',
    '<tool type="highlight" data=\'{"ids":[1]}\' onmouseover="alert(1)">x</tool>',
    '<question id="1" onclick="alert(1)"><header>H</header>'
    '<option message="m" onclick="alert(1)" href="javascript:alert(1)">A</option></question>',
    # URLs
    '<a href="javascript:alert(1)">click</a>',
    '<ref id="javascript:alert(1)"/>',
    '<id v="javascript:alert(1)">5</id>',
    '<question id="1"><header>H</header><option message="javascript:alert(1)">A</option></question>',
    # SVG
    "<svg onload=alert(1)>",
    "<svg><script>alert(1)</script></svg>",
    '<svg><a xlink:href="javascript:alert(1)"><text>x</text></a></svg>',
    # breakouts from message="…"
    '<question id="1"><header>H</header>'
    '<option message="x" onclick="alert(1)">A</option></question>',
    '<question id="1"><header>H</header>'
    '<option message="a&quot; onclick=&quot;alert(1)">A</option></question>',
    '<question id="1"><header>H</header>'
    '<option message="</button><script>alert(1)</script>">A</option></question>',
    "<question id='\"><script>alert(1)</script>'><header>H</header></question>",
    # breakouts from data='…'
    '<tool type="highlight" data=\'{"ids":[1],"x":"\'><script>alert(1)</script>"}\'>x</tool>',
    '<tool type="highlight" data=\'{"ids":[1],"x":"&#39;><img src=x onerror=alert(1)>"}\'>x</tool>',
    '<tool type="highlight" data=\'{"ids":[1],"x":"</tool><script>alert(1)</script>"}\'>x</tool>',
    '<tool type="find-similar" data=\'{"hint":"\\"><svg onload=alert(1)>"}\'>x</tool>',
    # breakouts through ${…}
    '<question id="1"><header>H</header><option message="${evil.q}">A</option></question>',
    "<question id=\"1\"><header>H</header><option message='${evil.s}'>A</option></question>",
    '<tool type="highlight" data="${hl}">${evil.html}</tool>',
    "<tool type=\"highlight\" data='${hl}'>x</tool>",
    "<id v=\"${evil.q}\">7</id> <id v='${evil.s}'>7</id>",
    '<ref id="${evil.js}"/> ${evil.svg} ${evil.html}',
    '<size value=${evil.q}/> <size value="${evil.s}"/>',
    "${evil.nested}",
]


@pytest.mark.parametrize("payload", XSS_PAYLOADS)
@pytest.mark.parametrize("role", ["assistant", "user"])
@pytest.mark.parametrize("streaming", [False, True])
def test_known_xss_payload_renders_inert(payload, role, streaming):
    html = render_message(
        payload, role=role, artifacts=NASTY_ARTIFACTS, streaming=streaming, message_id=1
    )
    assert_inert(html)
    assert "<script" not in html.lower()
    assert "<img" not in html.lower() and "<svg" not in html.lower()


@pytest.mark.parametrize("payload", XSS_PAYLOADS)
def test_known_xss_payload_inside_an_answer_renders_inert(payload):
    text = answer_compose(question_id=payload[:60], option_index=None, message=payload)
    assert_inert(render_message(text, role="user", artifacts={}))
    text = f'<answer question="{payload}">{payload}</answer>'
    assert_inert(render_message(text, role="user", artifacts={}))


def test_quote_breakout_stays_inside_the_data_attribute():
    html = render_message(
        '<question id="1"><header>H</header><option message="${evil.q}">A</option></question>',
        role="assistant",
        artifacts=NASTY_ARTIFACTS,
    )
    parser = _Attributes()
    parser.feed(html)
    [button] = [attrs for tag, attrs in parser.tags if tag == "button" and "data-message" in attrs]
    assert button["data-message"] == '" onclick="alert(1)" x="'
    assert set(button) == {"type", "class", "data-option-index", "data-message", "data-context"}


def test_a_code_fence_language_that_is_no_plain_name_gets_no_class():
    # Found by test_any_text_parses_and_renders_inert: the info string went into the class.
    html = render_message("```<javascript:alert(1)>\nx\n```", role="assistant", artifacts={})
    assert_inert(html)
    assert "language-" not in html
    assert 'class="language-python"' in render_message(
        "```python\nx = 1\n```", role="assistant", artifacts={}
    )


# --- Markdown payloads ------------------------------------------------------------------------
MARKDOWN_XSS_PAYLOADS = [
    # links
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "[click](java\tscript:alert(1))",
    "[click](&#106;avascript:alert(1))",
    "[click](&#x6A;avascript&#58;alert(1))",
    "[click](%6Aavascript:alert(1))",
    "[click](vbscript:msgbox(1))",
    "[click](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "[click](file:///etc/passwd)",
    "[click](//evil.example/x)",
    "[click](/relative/path)",
    '[click](https://ok.example/ "title\\" onmouseover=\\"alert(1))',
    '[click](https://ok.example/"onmouseover="alert(1))',
    '[a <ref id="3"/> link](https://ok.example/)',
    '[x](https://ok.example/<ref id="3"/>)',
    # images
    "![x](javascript:alert(1))",
    "![x](https://tracker.example/pixel.png)",
    '![x" onerror="alert(1)](https://ok.example/a.png)',
    "![<img src=x onerror=alert(1)>](https://ok.example/a.png)",
    # autolinks
    "<javascript:alert(1)>",
    "<JAVASCRIPT:alert(1)>",
    "<https://ok.example/?q=<script>>",
    "<mailto:a@b.example>",
    "<a@b.example>",
    # reference definitions
    "[x][r]\n\n[r]: javascript:alert(1)",
    '[x][r]\n\n[r]: https://ok.example/ "t\\" onclick=\\"alert(1)"',
    "![x][r]\n\n[r]: javascript:alert(1)",
    # HTML blocks and inline HTML
    "<div onclick=alert(1)>\n\n**x**\n\n</div>",
    "<script>\nalert(1)\n</script>",
    "<details open ontoggle=alert(1)>",
    "<!-- x --><img src=x onerror=alert(1)>",
    "text <span onclick=alert(1)>x</span> text",
    '<a href="javascript:alert(1)">**x**</a>',
    # entity tricks
    "&lt;img src=x onerror=alert(1)&gt;",
    "&#x3C;script&#x3E;alert(1)&#x3C;/script&#x3E;",
    "&#xe002;0&#xe003; and &#57346;0&#57347;",
    "`&#xe002;0&#xe003;`",
    "\\<script>alert(1)\\</script>",
    # code and tables
    "```html\n<script>alert(1)</script>\n```",
    '```" onclick="alert(1)\n<ref id="3"/>\n```',
    "`<img src=x onerror=alert(1)>`",
    "| a | b |\n|---|---|\n| <img src=x onerror=alert(1)> | [x](javascript:alert(1)) |",
    "| a |\n|:-:|\n| x |",
]


@pytest.mark.parametrize("payload", MARKDOWN_XSS_PAYLOADS)
@pytest.mark.parametrize("streaming", [False, True])
def test_markdown_xss_payload_renders_inert(payload, streaming):
    html = render_message(payload, role="assistant", artifacts=NASTY_ARTIFACTS, streaming=streaming)
    assert_inert(html)
    lowered = html.lower()
    assert "<script" not in lowered and "<img" not in lowered and "style=" not in lowered


def test_only_http_and_https_links_are_links():
    html = render_message(
        "[a](https://ok.example/) [b](http://ok.example/) [c](javascript:alert(1)) "
        "[d](/local) [e](mailto:a@b.example) <https://auto.example/>",
        role="assistant",
        artifacts={},
    )
    parser = _Attributes()
    parser.feed(html)
    links = [attrs for tag, attrs in parser.tags if tag == "a"]
    assert [a["href"] for a in links] == [
        "https://ok.example/",
        "http://ok.example/",
        "https://auto.example/",
    ]
    assert all(a["rel"] == LINK_REL and a["target"] == "_blank" for a in links)
    assert "[c](javascript:alert(1))" in html and "[d](/local)" in html


def test_a_sentinel_forged_through_an_entity_is_text_not_an_element():
    html = render_message(
        'A <ref id="5"/> then &#xe002;0&#xe003; twice', role="assistant", artifacts={}
    )
    assert html.count("data-annotation-id") == 1
