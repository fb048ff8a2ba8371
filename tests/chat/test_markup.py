"""The message markup on its documented examples (docs/markup.md, after the design's source
document): parsed, interpolated, rendered, answered."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from chat.markup import (
    Answer,
    Area,
    Emphasis,
    FindSimilarBlock,
    HighlightBlock,
    Length,
    Markdown,
    Missing,
    PendingBlock,
    QuestionBlock,
    Ref,
    Response,
    Text,
    TextBlock,
    answer_compose,
    message_plain_text,
    parse_message,
    render_message,
    response_compose,
    responses_in_transcript,
    transcript_questions,
)
from chat.markup.formatting import (
    format_area,
    format_credits,
    format_length,
    format_overlap,
    format_pixels,
    format_position,
)

# --- the documented examples, verbatim ----------------------------------------------------------
GENERIC_QUESTION = """<question id="1">
  <header>Would you like to proceed?</header>
  <option message="Yes, proceed with the aforementioned command.">Yes</option>
  <option message="Please abort the current execution.">No</option>
</question>"""

CLARIFICATION_QUESTION = """<question id="2">
  <header>Please clarify, do you mean A or B?</header>
  <option message="I mean A"><i>A</i></option>
  <option message="I mean B"><i>B</i></option>
  <option message="I don't actually mean either of those">Neither</option>
</question>"""

CONTEXT_QUESTION = """<question id="3">
  <header>Could you tell me what your visibility settings are?</header>
  <option message="Of course, here you go." context="visibility">Allow</option>
  <option message="No, find some other way.">Deny</option>
</question>"""

MULTI_CONTEXT_QUESTION = """<question id="4">
  <header>I'm not sure what you can see, let me take a look</header>
  <option
    message="Here's the viewport data."
    context="visibility position image"
  >
    Allow
  </option>
  <option message="No, I don't want to do that.">Deny</option>
</question>"""

ANSWER_WITH_INDEX = """<answer
  question="4"
  question-option-index="0"
>
  Here's the viewport data.
</answer>"""

FREE_ANSWER = """<answer question="2">Something else entirely</answer>"""

HIGHLIGHT = """<tool
  type="highlight"
  data='{
    "ids": [102, 103, 104, 201, 542],
    "links": [23, 23, 23, 51, 229],
    "linkValues": [4.3, 5.6, 5.8, 11.2, 18.9],
    "linkType": "distance"
  }'
>
  Showcase all trees that are within <distance value="20" /> of a house
</tool>"""

FIND_SIMILAR = """<tool
  type="find-similar"
  data='{
    "hint": "pool",
    "samples": [
      {"id": 25},
      {"id": 216, "v": "1234-abcd"}
    ]
  }'
>
  Find other swimming pools similar to <id>25</id> and
  <id v="1234-abcd">216</id>.
</tool>"""

RESPONSE = """<response
  type="find_similar"
  class-id=pool
  request="req-7"
>
  Find Similar located 3
  results
  belonging to class pool.
</response>"""

INTERPOLATED_ATTRIBUTES = """The distance from the largest tree to the largest house is
<size value="${distances.261.24}" />. The furthest house is
<size value="${distances.261.101}" /> away."""

INTERPOLATED_TOOL = """<tool
  type="highlight"
  data="${artifact-1234-abcd}"
>
  Show Buildings
</tool>

The closest building (<ref id="${artifact-1234-abcd.ids.0}" />) is
<size value="${artifact-1234-abcd.linkValues.0}" /> away from
<ref id="${artifact-1234-abcd.links.0}" /> and has an area of
<area id="${artifact-1234-abcd.areas.0}" />."""

ARTIFACTS = {
    "distances": {"261": {"24": 12.5, "101": 1840.0}},
    "artifact-1234-abcd": {
        "ids": [311, 312],
        "links": [40, 41],
        "linkValues": [7.25, 19.0],
        "linkType": "distance",
        "areas": [182.4, 25000],
        "attributeHints": {"areas": "area"},
    },
}


# --- a small reader of the rendered HTML ----------------------------------------------------
class Page(HTMLParser):
    """The rendered HTML as elements (tag, attrs, text inside) for assertions."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[dict] = []
        self._open: list[dict] = []
        self.feed(html)
        self.close()
        self.text = " ".join("".join(self._all_text).split())

    _all_text: list[str]

    def reset(self) -> None:
        super().reset()
        self._all_text = []

    def handle_starttag(self, tag, attrs):
        element = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.elements.append(element)
        if tag == "br":
            self.handle_data("\n")
        else:
            self._open.append(element)

    def handle_endtag(self, tag):
        while self._open:
            if self._open.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        self._all_text.append(data)
        for element in self._open:
            element["text"] += data

    def find(self, tag: str, cls: str | None = None) -> list[dict]:
        return [
            e
            for e in self.elements
            if e["tag"] == tag and (cls is None or cls in e["attrs"].get("class", "").split())
        ]

    def one(self, tag: str, cls: str | None = None) -> dict:
        found = self.find(tag, cls)
        assert len(found) == 1, found
        return found[0]


def render(text: str, **kwargs) -> Page:
    kwargs.setdefault("role", "assistant")
    kwargs.setdefault("artifacts", {})
    return Page(render_message(text, **kwargs))


def words(text: str) -> str:
    return " ".join(text.split())


# --- questions --------------------------------------------------------------------------------
def test_generic_question_parses_to_header_and_options_with_messages():
    [block] = parse_message(GENERIC_QUESTION, artifacts={})
    assert isinstance(block, QuestionBlock)
    assert block.id == "1"
    assert block.header == (Markdown("Would you like to proceed?"),)
    assert [(o.index, o.label, o.message, o.context) for o in block.options] == [
        (0, (Markdown("Yes"),), "Yes, proceed with the aforementioned command.", ()),
        (1, (Markdown("No"),), "Please abort the current execution.", ()),
    ]


def test_generic_question_renders_buttons_the_page_can_answer_with():
    page = render(GENERIC_QUESTION, message_id=12)
    root = page.one("div", "question")
    assert root["attrs"]["data-question-id"] == "1"
    assert root["attrs"]["data-message-id"] == "12"
    assert page.one("div", "question-header")["text"] == "Would you like to proceed?"
    buttons = page.find("button", "question-option")
    assert [(b["text"], b["attrs"]["data-option-index"]) for b in buttons] == [
        ("Yes", "0"),
        ("No", "1"),
    ]
    assert buttons[0]["attrs"]["data-message"] == "Yes, proceed with the aforementioned command."
    assert all(b["attrs"]["type"] == "button" and "disabled" not in b["attrs"] for b in buttons)


def test_clarification_question_keeps_italic_option_labels():
    [block] = parse_message(CLARIFICATION_QUESTION, artifacts={})
    assert block.options[0].label == (Emphasis("i", (Markdown("A"),)),)
    page = render(CLARIFICATION_QUESTION)
    assert [i["text"] for i in page.find("i")] == ["A", "B"]
    assert page.find("button", "question-option")[2]["attrs"]["data-message"] == (
        "I don't actually mean either of those"
    )


def test_context_question_exposes_the_requested_context_types():
    page = render(CONTEXT_QUESTION)
    allow, deny = page.find("button", "question-option")
    assert allow["attrs"]["data-context"] == "visibility"
    assert deny["attrs"]["data-context"] == ""


def test_multi_context_question_with_attributes_over_several_lines():
    [block] = parse_message(MULTI_CONTEXT_QUESTION, artifacts={})
    allow = block.options[0]
    assert allow.label == (Markdown("Allow"),)
    assert allow.message == "Here's the viewport data."
    assert allow.context == ("visibility", "position", "image")
    page = render(MULTI_CONTEXT_QUESTION)
    assert page.find("button", "question-option")[0]["attrs"]["data-context"] == (
        "visibility position image"
    )


def test_unknown_context_types_are_dropped_and_duplicates_kept_once():
    [block] = parse_message(
        '<question id="q"><header>H</header>'
        '<option message="m" context="image cookies image position">Go</option></question>',
        artifacts={},
    )
    assert block.options[0].context == ("image", "position")


def test_option_without_message_suggests_its_label():
    [block] = parse_message(
        '<question id="q"><header>H</header><option><b>Go</b> on</option></question>',
        artifacts={},
    )
    assert block.options[0].message == "Go on"


def asked_and_answered(question: str, *answers: str):
    """A transcript where message 1 asks `question` and messages 2… answer it."""
    return transcript_questions(
        [(1, "assistant", question), *((n, "user", a) for n, a in enumerate(answers, start=2))],
        artifacts={},
    )


def test_answered_question_renders_disabled_with_the_chosen_option_marked():
    answers = asked_and_answered(MULTI_CONTEXT_QUESTION, ANSWER_WITH_INDEX).answers_in(1)
    page = render(MULTI_CONTEXT_QUESTION, answers=answers)
    assert "answered" in page.one("div", "question")["attrs"]["class"]
    allow, deny = page.find("button", "question-option")
    assert "disabled" in allow["attrs"] and "disabled" in deny["attrs"]
    assert "chosen" in allow["attrs"]["class"].split()
    assert allow["attrs"]["aria-pressed"] == "true"
    assert "chosen" not in deny["attrs"]["class"].split()


def test_question_answered_in_own_words_shows_that_answer():
    answers = asked_and_answered(CLARIFICATION_QUESTION, FREE_ANSWER).answers_in(1)
    page = render(CLARIFICATION_QUESTION, answers=answers)
    assert not any("chosen" in b["attrs"]["class"] for b in page.find("button", "question-option"))
    assert all("disabled" in b["attrs"] for b in page.find("button", "question-option"))
    assert page.one("p", "question-free-answer")["text"] == "Answered: Something else entirely"


def test_an_open_question_offers_a_free_text_answer_and_an_answered_one_does_not():
    open_page = render(CLARIFICATION_QUESTION)
    field = open_page.one("input", "question-free-text")
    assert field["attrs"]["aria-label"] == "Answer in your own words"
    assert field["attrs"]["maxlength"] == "2000"
    assert open_page.one("form", "question-free-form")
    answers = asked_and_answered(CLARIFICATION_QUESTION, FREE_ANSWER).answers_in(1)
    answered = render(CLARIFICATION_QUESTION, answers=answers)
    assert answered.find("form", "question-free-form") == []
    assert answered.find("input", "question-free-text") == []


def test_unanswered_question_is_not_marked_by_another_questions_answer():
    answers = asked_and_answered(GENERIC_QUESTION, ANSWER_WITH_INDEX).answers_in(1)
    page = render(GENERIC_QUESTION, answers=answers)
    assert "answered" not in page.one("div", "question")["attrs"]["class"]


# --- answers and responses ------------------------------------------------------------------
def test_seed_answer_parses_with_zero_based_index_and_trimmed_message():
    [answer] = parse_message(ANSWER_WITH_INDEX, artifacts={}, role="user")
    assert answer == Answer(question_id="4", option_index=0, message="Here's the viewport data.")


def test_free_answer_has_no_option_index():
    assert asked_and_answered(CLARIFICATION_QUESTION, FREE_ANSWER).answers_in(1) == {
        "2": Answer(question_id="2", option_index=None, message="Something else entirely")
    }


def test_later_answer_to_the_same_question_wins():
    first = answer_compose(question_id="1", option_index=0, message="Yes")
    second = answer_compose(question_id="1", option_index=1, message="No")
    asked = asked_and_answered(GENERIC_QUESTION, first, "hello", second)
    assert asked.answers_in(1)["1"].option_index == 1


def test_the_same_question_id_asked_twice_is_two_questions_each_answered_on_its_own():
    first = answer_compose(question_id="1", option_index=1, message="No", asked_in=1)
    second = answer_compose(question_id="1", option_index=0, message="Yes", asked_in=3)
    asked = transcript_questions(
        [
            (1, "assistant", GENERIC_QUESTION),
            (2, "user", first),
            (3, "assistant", GENERIC_QUESTION),
            (4, "user", second),
        ],
        artifacts={},
    )
    assert asked.answers_in(1)["1"].option_index == 1
    assert asked.answers_in(3)["1"].option_index == 0
    assert asked.questions_answered_in(4)["1"].id == "1"
    page = render(GENERIC_QUESTION, answers={})
    assert "answered" not in page.one("div", "question")["attrs"]["class"]


def test_an_answer_names_the_earlier_of_two_questions_with_its_id_by_asked_in():
    late = answer_compose(question_id="1", option_index=0, message="Yes", asked_in=1)
    asked = transcript_questions(
        [(1, "assistant", GENERIC_QUESTION), (2, "assistant", GENERIC_QUESTION), (3, "user", late)],
        artifacts={},
    )
    assert set(asked.answers_in(1)) == {"1"} and asked.answers_in(2) == {}


def test_an_answer_without_asked_in_answers_the_latest_question_asked_before_it():
    typed = answer_compose(question_id="1", option_index=0, message="Yes")
    asked = transcript_questions(
        [
            (1, "assistant", GENERIC_QUESTION),
            (2, "assistant", GENERIC_QUESTION),
            (3, "user", typed),
            (4, "assistant", GENERIC_QUESTION),
        ],
        artifacts={},
    )
    assert asked.answers_in(1) == {} and asked.answers_in(4) == {}
    assert asked.answers_in(2)["1"].message == "Yes"


def test_an_answer_to_a_question_never_asked_answers_nothing():
    text = answer_compose(question_id="9", option_index=0, message="Yes", asked_in=1)
    asked = transcript_questions(
        [(1, "assistant", GENERIC_QUESTION), (2, "user", text)], artifacts={}
    )
    assert asked.answers == {} and asked.questions_answered_in(2) == {}


def test_user_answer_renders_as_the_chosen_option_under_its_question():
    questions = asked_and_answered(MULTI_CONTEXT_QUESTION, ANSWER_WITH_INDEX).questions_answered_in(
        2
    )
    page = render(ANSWER_WITH_INDEX, role="user", questions=questions)
    assert page.one("div", "answer-question")["text"] == (
        "I'm not sure what you can see, let me take a look"
    )
    assert page.one("div", "answer-choice")["text"] == "Allow"
    assert page.find("div", "answer-message") == []
    assert "<answer" not in page.text and "question-option-index" not in page.text


def test_user_answer_with_a_changed_message_shows_that_message_too():
    text = answer_compose(question_id="1", option_index=0, message="Yes, but only the trees")
    questions = asked_and_answered(GENERIC_QUESTION, text).questions_answered_in(2)
    page = render(text, role="user", questions=questions)
    assert page.one("div", "answer-choice")["text"] == "Yes"
    assert page.one("div", "answer-message")["text"] == "Yes, but only the trees"


def test_user_answer_without_the_question_at_hand_shows_its_message():
    page = render(FREE_ANSWER, role="user")
    assert page.text == "Something else entirely"


def test_seed_response_parses_its_stable_fields_and_count():
    [response] = parse_message(RESPONSE, artifacts={}, role="user")
    assert isinstance(response, Response)
    assert (response.type, response.class_id, response.request_id, response.count) == (
        "find_similar",
        "pool",
        "req-7",
        3,
    )
    assert response.text == "Find Similar located 3\n  results\n  belonging to class pool."


def test_user_response_renders_as_a_sentence_for_a_person():
    page = render(RESPONSE, role="user")
    root = page.one("div", "response")
    assert root["attrs"]["data-request-id"] == "req-7"
    assert root["attrs"]["data-count"] == "3"
    assert page.one("span", "response-text")["text"] == "Found 3 similar pools."
    assert "<response" not in page.text and "Find Similar located" not in page.text


@pytest.mark.parametrize(
    ("count", "class_id", "shown"),
    [
        (1, "solar_panel", "Found 1 similar solar panel."),
        (0, "pool", "Found no similar pools."),
        (20, "", "Found 20 similar annotations."),
    ],
)
def test_user_response_counts_in_words(count, class_id, shown):
    text = response_compose(class_id=class_id, request_id="r", count=count, class_name=class_id)
    assert render(text, role="user").one("span", "response-text")["text"] == shown


def test_user_text_around_an_answer_is_shown_as_typed():
    text = (
        "<b>bold?</b> " + answer_compose(question_id="1", option_index=1, message="No") + " &amp;"
    )
    page = render(text, role="user")
    assert page.find("b") == []
    assert page.text.startswith("<b>bold?</b>")
    assert page.text.endswith("&amp;")


# --- composing ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "message",
    [
        "Yes, proceed.",
        'She said "go" & <left> </answer> now',
        "line one\nline two",
        "${artifact.ids.0} stays literal",
        "&amp; is not decoded twice",
    ],
)
def test_composed_answer_parses_back_to_the_same_values(message):
    text = answer_compose(question_id='q"1<', option_index=2, message=message)
    assert parse_message(text, artifacts={}, role="user") == [
        Answer(question_id='q"1<', option_index=2, message=message)
    ]


def test_composed_free_answer_has_no_index():
    text = answer_compose(question_id="7", option_index=None, message="my own words")
    assert text == '<answer question="7">my own words</answer>'
    assert parse_message(text, artifacts={}, role="user")[0].option_index is None


def test_composed_answer_names_the_asking_message_and_parses_it_back():
    text = answer_compose(question_id="q-view", option_index=0, message="ok", asked_in=41)
    assert text == '<answer question="q-view" question-option-index="0" asked-in="41">ok</answer>'
    [answer] = parse_message(text, artifacts={}, role="user")
    assert answer.asked_in == "41"


def test_composed_response_matches_the_seed_format_and_parses_back():
    text = response_compose(class_id="pool", request_id="12-fs1", count=1, class_name="pool")
    assert text == (
        '<response type="find_similar" class-id="pool" request="12-fs1">'
        "Find Similar located 1 result belonging to class pool.</response>"
    )
    [response] = parse_message(text, artifacts={}, role="user")
    assert (response.class_id, response.request_id, response.count) == ("pool", "12-fs1", 1)
    assert responses_in_transcript([text])["12-fs1"].count == 1


def test_composed_response_escapes_hostile_class_names():
    text = response_compose(
        class_id='x" onclick="a', request_id="r", count=2, class_name="</response><b>"
    )
    [response] = parse_message(text, artifacts={}, role="user")
    assert response.class_id == 'x" onclick="a'
    assert response.text.endswith("belonging to class </response><b>.")


# --- tools --------------------------------------------------------------------------------------
def test_seed_highlight_parses_its_payload_and_body():
    [block] = parse_message(HIGHLIGHT, artifacts={})
    assert isinstance(block, HighlightBlock)
    assert block.error is None
    assert block.data == {
        "ids": [102, 103, 104, 201, 542],
        "links": [23, 23, 23, 51, 229],
        "linkValues": [4.3, 5.6, 5.8, 11.2, 18.9],
        "linkType": "distance",
    }
    assert block.body == (
        Markdown("Showcase all trees that are within "),
        Length(20.0, "distance"),
        Markdown(" of a house"),
    )


def test_seed_highlight_renders_its_json_a_button_and_the_formatted_distance():
    import json

    page = render(HIGHLIGHT)
    root = page.one("div", "highlight")
    assert json.loads(root["attrs"]["data-highlight"])["linkValues"] == [4.3, 5.6, 5.8, 11.2, 18.9]
    assert page.one("button", "highlight-apply")["text"] == "Show on map"
    assert page.one("span", "length")["text"] == "20 m"
    assert "Showcase all trees that are within 20 m of a house" in page.text


def test_seed_find_similar_parses_samples_and_id_chips():
    [block] = parse_message(FIND_SIMILAR, artifacts={}, message_id=31)
    assert isinstance(block, FindSimilarBlock)
    assert block.data == {"hint": "pool", "samples": [{"id": 25}, {"id": 216, "v": "1234-abcd"}]}
    assert block.request_id == "31-fs1"
    assert [p for p in block.body if isinstance(p, Ref)] == [Ref(25), Ref(216, "1234-abcd")]


def test_seed_find_similar_renders_json_request_id_button_and_chips():
    import json

    page = render(FIND_SIMILAR, message_id=31)
    root = page.one("div", "find-similar")
    assert json.loads(root["attrs"]["data-find-similar"])["hint"] == "pool"
    assert root["attrs"]["data-request-id"] == "31-fs1"
    assert page.one("button", "find-similar-run")["text"] == "Find similar"
    chips = page.find("button", "ref")
    assert [(c["attrs"]["data-annotation-id"], c["attrs"].get("data-vector")) for c in chips] == [
        ("25", None),
        ("216", "1234-abcd"),
    ]


@pytest.mark.parametrize(
    ("data", "classes", "runs"),
    [
        ('{"hint": "pools"}', {"pool", "house"}, True),
        ('{"hint": "unicorn"}', {"pool", "house"}, False),
        ('{"hint": "unicorn", "samples": [{"id": 3}]}', {"pool"}, True),  # the sample's class
        ('{"hint": "unicorn"}', None, True),  # the data's classes unknown: not judged
    ],
)
def test_a_find_similar_block_offers_its_button_only_when_its_search_can_run(data, classes, runs):
    page = render(f"<tool type=\"find-similar\" data='{data}'>Find</tool>", classes=classes)
    assert bool(page.find("button", "find-similar-run")) is runs
    if not runs:
        chip = page.one("span", "markup-error")
        assert chip["attrs"]["title"] == (
            "“unicorn” names no class on this map, and there are no samples to compare with"
        )


def test_find_similar_already_run_shows_its_response():
    responses = responses_in_transcript(
        [response_compose(class_id="pool", request_id="31-fs1", count=4, class_name="pool")]
    )
    page = render(FIND_SIMILAR, message_id=31, responses=responses)
    assert "done" in page.one("div", "find-similar")["attrs"]["class"]
    assert page.one("span", "find-similar-result")["text"] == "Found 4 similar pools."


def test_overlap_linked_highlight_is_valid():
    text = (
        '<tool type="highlight" data=\'{"ids":[1,2],"links":[3,4],"linkValues":[0.25,1],'
        '"linkType":"overlap","attributeHints":{"share":"credits"},"share":[1,2]}\'>x</tool>'
    )
    [block] = parse_message(text, artifacts={})
    assert block.error is None


def test_simple_highlight_with_extra_attributes_is_valid():
    [block] = parse_message(
        '<tool type="highlight" data=\'{"ids":[7],"note":"any"}\'>x</tool>', artifacts={}
    )
    assert block.error is None and block.data["note"] == "any"


# --- interpolation ------------------------------------------------------------------------------
def test_seed_attribute_interpolation_resolves_keys_of_an_artifact():
    [block] = parse_message(INTERPOLATED_ATTRIBUTES, artifacts=ARTIFACTS)
    assert [p for p in block.parts if isinstance(p, Length)] == [
        Length(12.5, "size"),
        Length(1840.0, "size"),
    ]
    page = render(INTERPOLATED_ATTRIBUTES, artifacts=ARTIFACTS)
    assert [s["text"] for s in page.find("span", "length")] == ["12.5 m", "1.8 km"]


def test_seed_tool_interpolation_takes_the_whole_artifact_as_data():
    blocks = parse_message(INTERPOLATED_TOOL, artifacts=ARTIFACTS)
    highlight, text = blocks
    assert highlight.data == ARTIFACTS["artifact-1234-abcd"]
    assert highlight.error is None
    assert [p for p in text.parts if not isinstance(p, Text | Markdown)] == [
        Ref(311),
        Length(7.25, "size"),
        Ref(40),
        Area(182.4),
    ]
    page = render(INTERPOLATED_TOOL, artifacts=ARTIFACTS)
    assert [c["attrs"]["data-annotation-id"] for c in page.find("button", "ref")] == ["311", "40"]
    assert page.one("span", "area")["text"] == "182 m²"
    assert "The closest building (#311) is 7.2 m away from #40 and has an area of 182 m²." in (
        page.text
    )


def test_interpolation_indexes_lists_and_reads_text_placeholders():
    artifacts = {"a": {"rows": [{"name": 'O"Brien <b>'}, {"name": "two"}]}}
    page = render("Owner: ${a.rows.0.name}; whole: ${a.rows.1}", artifacts=artifacts)
    assert page.find("b") == []
    assert page.text == 'Owner: O"Brien <b>; whole: {"name": "two"}'


def test_a_value_full_of_quotes_cannot_leave_its_attribute():
    artifacts = {"evil": {"m": '" onclick="alert(1)" x="', "d": "'><script>alert(1)</script>"}}
    text = (
        '<question id="q"><header>H</header>'
        "<option message=\"${evil.m}\" context='${evil.d}'>Go</option></question>"
    )
    page = render(text, artifacts=artifacts)
    button = page.one("button", "question-option")
    assert button["attrs"]["data-message"] == '" onclick="alert(1)" x="'
    assert "onclick" not in button["attrs"]
    assert page.find("script") == []


def test_placeholder_inside_a_longer_attribute_becomes_text():
    artifacts = {"a": {"n": 3, "obj": {"k": [1]}}}
    [block] = parse_message(
        '<question id="q"><header>H</header>'
        '<option message="Take ${a.n} of ${a.obj}">Go</option></question>',
        artifacts=artifacts,
    )
    assert block.options[0].message == 'Take 3 of {"k": [1]}'


def test_unknown_artifact_or_path_shows_a_missing_value_marker():
    page = render("a ${nope} b ${distances.999} c ${distances.261.24.x}", artifacts=ARTIFACTS)
    assert len(page.find("span", "markup-missing")) == 3
    assert page.text == "a missing value b missing value c missing value"


def test_missing_value_in_an_attribute_is_an_error_chip():
    blocks = parse_message(
        'The size is <size value="${distances.7}" /> and <tool type="highlight" '
        'data="${gone}">Show</tool>',
        artifacts=ARTIFACTS,
    )
    assert blocks[0].parts[1].label == "invalid <size>"
    assert "${distances.7}" in blocks[0].parts[1].detail
    assert blocks[1].error == "missing value ${gone}"
    page = render('<tool type="highlight" data="${gone}">Show</tool>', artifacts=ARTIFACTS)
    assert page.one("span", "markup-error")["attrs"]["title"] == "missing value ${gone}"
    assert (
        "Show" in page.text
        and page.find("div", "highlight")[0]["attrs"].get("data-highlight") is None
    )


def test_interpolated_values_are_not_interpolated_again():
    page = render("${a.t}", artifacts={"a": {"t": "${a.secret}", "secret": "s3cret"}})
    assert page.text == "${a.secret}"


def test_user_messages_are_never_interpolated():
    page = render("show ${distances.261.24}", role="user", artifacts=ARTIFACTS)
    assert page.text == "show ${distances.261.24}"


# --- text, inline elements and formatting ---------------------------------------------------
def test_text_is_escaped_and_line_breaks_kept():
    page = render("a <script>x</script> & b\nc")
    assert page.find("script") == []
    assert page.find("br")
    assert page.text == "a <script>x</script> & b c"


def test_inline_values_render_formatted():
    page = render(
        '<distance value="4.3"/>, <size value="1234"/>, <area value="8500"/>, '
        '<area value="12500"/>, <ref id="9"/>, <b>bold</b>'
    )
    assert [s["text"] for s in page.find("span", "value")] == [
        "4.3 m",
        "1.2 km",
        "8,500 m²",
        "1.25 ha",
    ]
    chip = page.one("button", "ref")
    assert chip["attrs"] == {
        "type": "button",
        "class": "chip ref",
        "data-annotation-id": "9",
    }
    assert page.one("b")["text"] == "bold"


@pytest.mark.parametrize(
    ("formatter", "value", "expected"),
    [
        (format_length, 0.456, "0.46 m"),
        (format_length, 4.3, "4.3 m"),
        (format_length, 20, "20 m"),
        (format_length, 123.4, "123 m"),
        (format_length, 1234, "1.2 km"),
        (format_length, 250_000, "250 km"),
        (format_area, 850, "850 m²"),
        (format_area, 2.25, "2.2 m²"),
        (format_area, 12_500, "1.25 ha"),
        (format_area, 3_400_000, "340 ha"),
        (format_overlap, 0.42, "42%"),
        (format_overlap, 0.045, "4.5%"),
        (format_credits, 1, "1 credit"),
        (format_credits, 2.5, "2.5 credits"),
        (format_pixels, 120, "120 px"),
        (format_position, {"latitude": 52.52, "longitude": -13.405}, "52.52000° N, 13.40500° W"),
        (format_position, [13.405, -52.52], "52.52000° S, 13.40500° E"),
        (format_length, "not a number", "—"),
        (format_position, {"latitude": 99, "longitude": 0}, "—"),
    ],
)
def test_measures_are_formatted_for_people(formatter, value, expected):
    assert formatter(value) == expected


def test_format_filters_are_available_to_templates():
    from django.template import Context, Template

    template = Template(
        "{% load geosense_format %}{{ d|meters }} {{ a|square_meters }} {{ o|overlap_percent }} "
        "{{ c|credits }} {{ p|latlon }} {{ x|pixels }}"
    )
    html = template.render(Context({"d": 1200, "a": 20000, "o": 0.5, "c": 3, "p": [1, 2], "x": 5}))
    assert html == "1.2 km 2 ha 50% 3 credits 2.00000° N, 1.00000° E 5 px"


def test_plain_text_preview_reads_without_markup():
    assert message_plain_text(HIGHLIGHT) == "Showcase all trees that are within 20 m of a house"
    assert message_plain_text(GENERIC_QUESTION) == "Would you like to proceed?"
    assert message_plain_text(ANSWER_WITH_INDEX, role="user") == "Here's the viewport data."


# --- streaming ----------------------------------------------------------------------------------
@pytest.mark.parametrize("cut", range(1, len(INTERPOLATED_TOOL) + 1, 7))
def test_every_prefix_of_a_streaming_message_renders_without_raw_markup(cut):
    page = render(INTERPOLATED_TOOL[:cut], artifacts=ARTIFACTS, streaming=True)
    assert "<" not in page.text and "${" not in page.text


@pytest.mark.parametrize("cut", range(1, len(MULTI_CONTEXT_QUESTION) + 1, 5))
def test_a_streaming_question_shows_a_placeholder_until_it_closes(cut):
    blocks = parse_message(MULTI_CONTEXT_QUESTION[:cut], artifacts={}, streaming=True)
    if cut == len(MULTI_CONTEXT_QUESTION):
        assert isinstance(blocks[0], QuestionBlock)
    else:
        assert all(isinstance(b, PendingBlock | TextBlock) for b in blocks)
        assert "<" not in render(MULTI_CONTEXT_QUESTION[:cut], streaming=True).text


def test_streaming_hides_a_half_written_placeholder_and_closes_open_emphasis():
    [block] = parse_message("Area: ${artifact-1234-ab", artifacts=ARTIFACTS, streaming=True)
    assert block.parts == (Markdown("Area:"),)
    [block] = parse_message("so <b>very", artifacts={}, streaming=True)
    assert block.parts == (Markdown("so "), Emphasis("b", (Markdown("very"),)))


def test_finished_message_renders_the_same_as_the_last_streamed_one():
    streamed = render_message(FIND_SIMILAR, role="assistant", artifacts={}, streaming=True)
    final = render_message(FIND_SIMILAR, role="assistant", artifacts={})
    assert streamed == final


def test_missing_marker_is_not_an_error_in_text():
    [block] = parse_message("x ${nope.a}", artifacts={})
    assert block.parts == (Markdown("x "), Missing("${nope.a}"))


# --- Markdown ---------------------------------------------------------------------------------
def html_of(text: str, **options) -> str:
    return render_message(text, role="assistant", artifacts=options.pop("artifacts", {}), **options)


def test_markdown_renders_headings_emphasis_lists_quotes_and_rules():
    page = render("## Trees\n\n**bold**, *em*, ~~gone~~\n\n- a\n- b\n\n1. one\n\n> quote\n\n---")
    assert page.one("h2")["text"] == "Trees"
    assert [page.one(t)["text"] for t in ("strong", "em", "s")] == ["bold", "em", "gone"]
    assert len(page.find("li")) == 3 and page.find("blockquote") and page.find("hr")


def test_a_gfm_table_renders_with_alignment_as_a_class():
    page = render('| a | b |\n|:--|--:|\n| 1 | <distance value="4"/> |')
    assert [c["text"] for c in page.find("th")] == ["a", "b"]
    cells = page.find("td")
    assert cells[1]["attrs"]["class"] == "align-right"
    assert "style" not in html_of("| a |\n|:-:|\n| 1 |")
    assert page.one("span", "length")["text"] == "4 m"


def test_code_blocks_and_spans_are_escaped_and_show_geosense_tags_as_written():
    html = html_of('```html\n<b>hi</b> <ref id="3"/>\n```\n\nand `<size value="2"/>` here')
    assert '<pre><code class="language-html">&lt;b&gt;hi&lt;/b&gt; &lt;ref id="3"/&gt;' in html
    assert "<code>&lt;size value=&quot;2&quot;/&gt;</code>" in html or (
        '<code>&lt;size value="2"/&gt;</code>' in html
    )
    assert "data-annotation-id" not in html


def test_elements_sit_inside_markdown_structure():
    page = render('- **closest: <ref id="3"/>**\n- then <ref id="4"/> at <size value="5"/>')
    items = page.find("li")
    assert len(items) == 2
    assert [b["attrs"]["data-annotation-id"] for b in page.find("button", "ref")] == ["3", "4"]
    assert page.one("strong")["text"] == "closest: #3"


def test_markdown_inside_headers_option_labels_and_tool_bodies_is_inline_only():
    page = render(
        '<question id="q"><header>Pick **one**</header>'
        '<option message="a">*A* `x`</option></question>'
        '<tool type="highlight" data=\'{"ids":[1]}\'>Show **these**\n\n- not a list</tool>'
    )
    assert page.one("div", "question-header")["text"] == "Pick one"
    assert page.find("strong") and page.find("em") and page.find("code")
    assert page.find("ul") == [] and page.find("p") == []


def test_a_plain_option_label_gives_its_words_as_the_default_message():
    [block] = parse_message(
        '<question id="q"><header>H</header><option>**Yes**, go</option></question>',
        artifacts={},
    )
    assert block.options[0].message == "Yes, go"


def test_interpolated_values_are_text_never_markdown():
    html = html_of(
        "${a.s} and ${a.l}", artifacts={"a": {"s": "**x** [y](https://e.x)", "l": "`c`"}}
    )
    assert "<strong>" not in html and "<a " not in html and "<code>" not in html
    assert "**x** [y](https://e.x) and `c`" in html


def test_single_line_breaks_are_kept_as_in_a_chat():
    assert "Line one<br>\nLine two" in html_of("Line one\nLine two")


def test_images_become_links_and_are_never_loaded():
    page = render("![the map](https://example.org/map.png)")
    assert page.find("img") == []
    link = page.one("a")
    assert link["attrs"]["href"] == "https://example.org/map.png" and link["text"] == "the map"


def test_raw_html_from_the_model_is_shown_as_text():
    html = html_of("<div>hi</div> and <u>x</u>")
    assert "&lt;div&gt;hi&lt;/div&gt; and &lt;u&gt;x&lt;/u&gt;" in html


def test_message_plain_text_drops_markdown_syntax():
    assert message_plain_text("**Twelve** trees near `#3`, see [map](https://x.y)") == (
        "Twelve trees near #3, see map"
    )


# --- streaming Markdown -----------------------------------------------------------------------
def test_streaming_shows_an_unclosed_emphasis_as_text_until_it_closes():
    assert "**bold" in html_of("Some **bold", streaming=True)
    assert "<strong>bold</strong>" in html_of("Some **bold**", streaming=True)


def test_streaming_shows_an_unclosed_fence_as_text_and_the_final_render_as_code():
    partial = html_of("Look:\n\n```python\nprint(1)", streaming=True)
    assert "<pre>" not in partial and "<code" not in partial
    assert '<p class="markdown-pending">```python<br>print(1)</p>' in partial
    done = html_of("Look:\n\n```python\nprint(1)\n```\n", streaming=True)
    assert '<pre><code class="language-python">print(1)' in done
    assert "markdown-pending" not in done


def test_streaming_holds_back_a_last_line_that_is_only_syntax():
    for tail in ("-", "|--", "1.", "#", "===", "> ", "```"):
        html = html_of(f"Trees\n{tail}", streaming=True)
        assert "<h1>" not in html and "<h2>" not in html and "<li>" not in html, tail
        assert "<p>Trees</p>" in html, (tail, html)


def test_streaming_keeps_a_table_header_as_text_until_its_delimiter_row_is_complete():
    assert "<table>" not in html_of("| a | b |\n|--", streaming=True)
    assert "<table>" in html_of("| a | b |\n|---|---|\n| 1", streaming=True)


def test_the_final_render_of_a_message_ignores_the_streaming_rules():
    assert "<li>" in html_of("Trees\n- one\n-")
