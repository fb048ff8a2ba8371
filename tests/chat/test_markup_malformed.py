"""Broken markup degrades to text or a visible error chip, and the rest of the message renders."""

from __future__ import annotations

import json

import pytest

from chat.markup import (
    FindSimilarBlock,
    HighlightBlock,
    Markdown,
    MarkupError,
    QuestionBlock,
    Text,
    TextBlock,
    parse_message,
    render_message,
)
from chat.markup.validation import MAX_IDS
from tests.chat.test_markup import Page


def render(text: str, **kwargs) -> Page:
    kwargs.setdefault("role", "assistant")
    kwargs.setdefault("artifacts", {})
    return Page(render_message(text, **kwargs))


def highlight(data: str) -> str:
    return f"Before. <tool type=\"highlight\" data='{data}'>Show them</tool> After."


# --- payloads that break the contract -------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ('{"ids": [1, 2', "data is not valid JSON"),
        ("not json at all", "data is not valid JSON"),
        ('{"ids": [NaN]}', "data is not valid JSON"),
        ('{"ids": [1e999]}', "ids must be non-negative integers"),
        ("[1, 2, 3]", "data must be a JSON object"),
        ('"ids"', "data must be a JSON object"),
        ("{}", "ids must be a list of annotation ids"),
        ('{"ids": "1,2"}', "ids must be a list of annotation ids"),
        ('{"ids": [1, "2"]}', "ids must be non-negative integers"),
        ('{"ids": [1, true]}', "ids must be non-negative integers"),
        ('{"ids": [1.5]}', "ids must be non-negative integers"),
        ('{"ids": [-4]}', "ids must be non-negative integers"),
        ('{"ids": [99999999999999999999999]}', "ids must be non-negative integers"),
        (
            '{"ids": [1], "links": [2, 3], "linkType": "distance"}',
            "links must be annotation ids, one per id",
        ),
        ('{"ids": [1], "links": [2]}', "linkType must be 'distance' or 'overlap'"),
        (
            '{"ids": [1], "links": [2], "linkType": "speed"}',
            "linkType must be 'distance' or 'overlap'",
        ),
        ('{"ids": [1], "linkType": "distance"}', "linkType and linkValues need links"),
        ('{"ids": [1], "linkValues": [3]}', "linkType and linkValues need links"),
        (
            '{"ids": [1, 2], "links": [3, 4], "linkType": "distance", "linkValues": [1]}',
            "linkValues must be numbers, one per id",
        ),
        (
            '{"ids": [1], "links": [3], "linkType": "distance", "linkValues": ["far"]}',
            "linkValues must be numbers, one per id",
        ),
        (
            '{"ids": [1], "links": [3], "linkType": "distance", "linkValues": [-2]}',
            "linkValues must not be negative",
        ),
        (
            '{"ids": [1], "links": [3], "linkType": "overlap", "linkValues": [42]}',
            "overlap linkValues are fractions between 0 and 1",
        ),
        (
            '{"ids": [1], "attributeHints": {"areas": "volume"}}',
            "attributeHints must map names to area, credits, length, pixels, position",
        ),
        (
            '{"ids": [1], "attributeHints": ["area"]}',
            "attributeHints must map names to area, credits, length, pixels, position",
        ),
        (
            '{"ids": [1, 2], "areas": [5], "attributeHints": {"areas": "area"}}',
            "areas must have one value per id",
        ),
        ("[" * 5000 + "]" * 5000, "data is not valid JSON"),
    ],
)
def test_invalid_highlight_payload_is_an_error_chip_and_the_message_still_renders(data, problem):
    blocks = parse_message(highlight(data), artifacts={})
    [tool] = [b for b in blocks if isinstance(b, HighlightBlock)]
    assert tool.data is None
    assert tool.error == problem
    page = render(highlight(data))
    chip = page.one("span", "markup-error")
    assert chip["attrs"]["title"] == problem
    assert page.find("div", "highlight")[0]["attrs"].get("data-highlight") is None
    assert page.text.startswith("Before.") and page.text.endswith("After.")
    assert "Show them" in page.text


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ("{}", "find-similar needs a hint or samples"),
        ('{"hint": 3}', "hint must be a text of at most 200 characters"),
        ('{"hint": "' + "p" * 201 + '"}', "hint must be a text of at most 200 characters"),
        ('{"samples": {"id": 1}}', "samples must be a list of annotations"),
        (
            json.dumps({"samples": [{"id": i} for i in range(21)]}),
            "a search takes at most 20 samples (21 given)",
        ),
        ('{"samples": [{"id": "25"}]}', "each sample needs an integer id"),
        ('{"samples": [25]}', "each sample needs an integer id"),
        ('{"samples": [{"id": 25, "v": 7}]}', "a sample's v must be a short text"),
        ('{"samples": [{"id": -1}]}', "sample ids must not be negative"),
    ],
)
def test_invalid_find_similar_payload_is_an_error_chip(data, problem):
    text = f"<tool type=\"find-similar\" data='{data}'>Find <id>25</id></tool>"
    [tool] = parse_message(text, artifacts={})
    assert isinstance(tool, FindSimilarBlock)
    assert (tool.data, tool.error) == (None, problem)
    page = render(text)
    assert page.one("span", "markup-error")["attrs"]["title"] == problem
    assert page.find("button", "find-similar-run") == []
    assert page.one("button", "ref")["attrs"]["data-annotation-id"] == "25"


def test_tool_without_data_or_with_an_unknown_type_is_an_error_chip():
    [tool] = parse_message('<tool type="highlight">Show</tool>', artifacts={})
    assert tool.error == "the tool has no data"
    [text] = parse_message('<tool type="teleport" data="{}">Go there</tool>', artifacts={})
    assert isinstance(text, TextBlock)
    assert text.parts == (
        MarkupError("unknown tool", "type must be highlight or find-similar"),
        Markdown("Go there"),
    )


def test_artifact_that_breaks_the_contract_is_an_error_chip():
    artifacts = {"a": {"ids": ["x"]}, "b": [1, 2], "c": {"ids": [1], "v": float("nan")}}
    for name, problem in [
        ("a", "ids must be non-negative integers"),
        ("b", "data must be a JSON object"),
        ("c", "data holds values that are not JSON"),
    ]:
        [tool] = parse_message(
            f'<tool type="highlight" data="${{{name}}}">x</tool>', artifacts=artifacts
        )
        assert tool.error == problem


def test_artifact_holding_json_text_is_read_as_json():
    [tool] = parse_message(
        '<tool type="highlight" data="${a.raw}">x</tool>', artifacts={"a": {"raw": '{"ids": [4]}'}}
    )
    assert tool.data == {"ids": [4]}


# --- huge payloads --------------------------------------------------------------------------
def test_payload_with_too_many_ids_is_refused():
    artifacts = {"big": {"ids": list(range(MAX_IDS + 1))}}
    [tool] = parse_message('<tool type="highlight" data="${big}">x</tool>', artifacts=artifacts)
    assert tool.error == f"too many ids ({MAX_IDS + 1:,}; at most {MAX_IDS:,})"


def test_payload_at_the_id_limit_is_accepted():
    ids = list(range(MAX_IDS))
    artifacts = {"big": {"ids": ids, "links": ids, "linkType": "distance"}}
    [tool] = parse_message('<tool type="highlight" data="${big}">x</tool>', artifacts=artifacts)
    assert tool.error is None
    assert json.loads(tool.data_json)["ids"][-1] == MAX_IDS - 1


def test_oversized_inline_data_is_refused_before_parsing():
    data = '{"ids": [1], "pad": "' + "x" * 4_100_000 + '"}'
    [tool] = parse_message(highlight(data), artifacts={})[1:2]
    assert tool.error == "data is too large"


def test_oversized_artifact_extras_are_refused():
    artifacts = {"big": {"ids": [1], "pad": "x" * 4_100_000}}
    [tool] = parse_message('<tool type="highlight" data="${big}">x</tool>', artifacts=artifacts)
    assert tool.error == "data is too large"


def test_huge_value_interpolated_into_text_is_shortened():
    [block] = parse_message("${a}", artifacts={"a": list(range(10_000))})
    assert len(block.parts[0].text) == 2001 and block.parts[0].text.endswith("…")


# --- unclosed and misplaced tags ------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        '<question id="1"><header>Proceed?</header><option message="y">Yes</option>',
        '<tool type="highlight" data=\'{"ids": [1]}\'>Show',
        "<b>never closed",
        "<id>25",
        '<option message="y">Yes</option>',
        "<header>alone</header>",
        "</question></tool></b>",
        '<size value="20"',
        '<ref id="3" onclick="x"',
        '<question id="1" <header>',
        "<answer question='1'>in an assistant message</answer>",
    ],
)
def test_unclosed_or_misplaced_markup_is_shown_as_text(text):
    page = render(text)
    assert page.find("div", "question") == [] and page.find("div", "tool") == []
    assert page.find("button") == []
    assert all(e["tag"] in {"div", "span", "br", "b", "i", "p"} for e in page.elements)


def test_unclosed_question_before_a_good_one_leaves_the_good_one_intact():
    text = (
        '<question id="1"><header>Lost</header> then '
        '<question id="2"><header>Kept?</header><option message="y">Yes</option></question>'
    )
    blocks = parse_message(text, artifacts={})
    assert isinstance(blocks[0], TextBlock)
    assert isinstance(blocks[1], QuestionBlock) and blocks[1].id == "2"


def test_question_without_id_is_an_error_chip_with_its_header():
    [block] = parse_message(
        '<question><header>Which?</header><option message="a">A</option></question>', artifacts={}
    )
    assert block == TextBlock(
        (MarkupError("invalid <question>", "a question needs a short id"), Markdown("Which?"))
    )


def test_question_with_an_overlong_id_is_an_error_chip():
    [block] = parse_message(
        f'<question id="{"x" * 65}"><header>H</header></question>', artifacts={}
    )
    assert isinstance(block, TextBlock) and block.parts[0].label == "invalid <question>"


def test_too_many_options_keep_the_first_twenty():
    options = "".join(f'<option message="{n}">{n}</option>' for n in range(25))
    [block] = parse_message(
        f'<question id="q"><header>H</header>{options}</question>', artifacts={}
    )
    assert len(block.options) == 20
    assert block.notes == (MarkupError("too many options", "at most 20 options"),) * 5


def test_option_with_a_missing_interpolated_message_is_shown_disabled_with_a_chip():
    text = '<question id="q"><header>H</header><option message="${gone.m}">Go</option></question>'
    page = render(text)
    assert page.find("button", "question-option") == []
    assert page.one("span", "markup-error")["attrs"]["title"] == "missing value ${gone.m}"


# --- nested blocks --------------------------------------------------------------------------
def test_question_inside_a_tool_is_an_error_chip():
    text = (
        '<tool type="highlight" data=\'{"ids": [1]}\'>Look '
        '<question id="9"><header>Inner?</header><option message="x">X</option></question>'
        " here</tool>"
    )
    [tool] = parse_message(text, artifacts={})
    assert tool.error is None
    assert tool.body == (
        Markdown("Look "),
        MarkupError("nested <question>", "blocks cannot be nested"),
        Markdown(" here"),
    )
    assert render(text).find("button", "question-option") == []


def test_tool_inside_a_question_option_is_an_error_chip():
    text = (
        '<question id="1"><header>H</header><option message="m">A '
        '<tool type="highlight" data=\'{"ids": [1]}\'>x</tool></option></question>'
    )
    [question] = parse_message(text, artifacts={})
    assert question.options[0].label == (
        Markdown("A "),
        MarkupError("nested <tool>", "blocks cannot be nested"),
    )


def test_question_inside_a_question_keeps_the_outer_one():
    text = (
        '<question id="outer"><header>Outer</header>'
        '<question id="inner"><header>Inner</header></question>'
        '<option message="o">O</option></question>'
    )
    [question] = parse_message(text, artifacts={})
    assert question.id == "outer"
    assert [o.message for o in question.options] == ["o"]
    assert question.notes == (MarkupError("nested <question>", "blocks cannot be nested"),)


def test_deeply_nested_emphasis_renders_without_recursion_trouble():
    text = "<b>" * 3000 + "deep" + "</b>" * 3000
    page = render(text)
    assert page.text == "deep"
    assert len(page.find("b")) <= 9


# --- bad inline elements --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "label"),
    [
        ('<distance value="far" />', "invalid <distance>"),
        ('<distance value="-3" />', "invalid <distance>"),
        ('<size value="nan" />', "invalid <size>"),
        ('<size value="1e999" />', "invalid <size>"),
        ("<size />", "invalid <size>"),
        ('<area value="big" />', "invalid <area>"),
        ('<ref id="abc" />', "invalid <ref>"),
        ('<ref id="1.5" />', "invalid <ref>"),
        ("<ref />", "invalid <ref>"),
        ("<id>twenty</id>", "invalid <id>"),
        ('<id v="">25</id>', "invalid <id>"),
    ],
)
def test_bad_inline_values_are_error_chips_inside_the_text(text, label):
    [block] = parse_message(f"Before {text} after", artifacts={})
    assert block.parts[0] == Markdown("Before ")
    assert block.parts[1].label == label
    assert block.parts[2] == Markdown(" after")


def test_interpolated_value_of_the_wrong_type_is_an_error_chip():
    artifacts = {"a": {"name": "house", "flag": True, "ids": [{"id": 1}]}}
    [block] = parse_message(
        '<size value="${a.name}"/> <ref id="${a.flag}"/> <ref id="${a.ids.0}"/>',
        artifacts=artifacts,
    )
    assert [p.label for p in block.parts if isinstance(p, MarkupError)] == [
        "invalid <size>",
        "invalid <ref>",
        "invalid <ref>",
    ]


def test_empty_and_whitespace_messages_have_no_blocks():
    assert parse_message("", artifacts={}) == []
    assert parse_message(" \n\t ", artifacts={}) == []
    assert render_message("", role="assistant", artifacts={}) == ""
    assert render_message("", role="user", artifacts={}) == ""


def test_answer_with_a_bad_index_counts_as_a_free_answer():
    [answer] = parse_message(
        '<answer question="1" question-option-index="first">Yes</answer>', artifacts={}, role="user"
    )
    assert answer.option_index is None and answer.message == "Yes"


def test_answer_without_a_question_stays_text():
    [block] = parse_message("<answer>Yes</answer>", artifacts={}, role="user")
    assert block == TextBlock((Text("<answer>Yes</answer>"),))
