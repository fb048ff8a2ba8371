"""How OpenAI-compatible servers stream a chat completion: pure functions, no I/O.

Real servers differ from OpenAI's own stream in ways a strict reader trips over (the facts,
with their sources, are in docs/models.md, "How each server streams"); the fixtures in
tests/fakes/dialects/ replay each of them. Two layers:

- `SseDecoder` (a body's bytes as they arrive; `sse_events` for decoded lines): Server-Sent
  Events framing. Gives each event's data, `[DONE]`, and the non-standard `error:` field that
  llama.cpp builds of 2025 send instead of a data frame. Comments (keep-alives) are skipped;
  an event cut off by the end of the body still counts.
- `ChunkParser`: the chunk objects (dicts, exactly as the server sent them) to what an agent
  yields: `TextDelta`, `Thinking` (reasoning, never part of the answer), `ToolCallRequest`,
  and the last `Usage` the server reported. `feed()` takes one chunk and returns what it
  completes; `close()` ends the stream and returns the tool calls.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from .base import AgentError, TextDelta, Thinking, ToolCallRequest, Usage

DONE = "[DONE]"
THINKING_FLUSH_CHARS = 2000
_LEGACY_FUNCTION_INDEX = -1  # `delta.function_call` of the deprecated functions API
_PARAGRAPH_RE = re.compile(r"\n[ \t]*\n")
_LINE_END_RE = re.compile("\r\n|\r|\n")
_utf8_decode = codecs.utf_8_decode
# The longest line, and the most data of one event, a stream may send (a tool call's arguments
# arrive in one event from some servers: 16 Mi characters leaves them room and bounds memory).
EVENT_LIMIT_CHARS = 16 * 1024 * 1024


StreamItem = TextDelta | Thinking | ToolCallRequest | Usage


# --- Server-Sent Events ----------------------------------------------------------------------
@dataclass(frozen=True)
class SseError:
    """A non-standard `error:` field (llama.cpp through 2025): the server's error as JSON text."""

    error: str


# An event: its data (JSON text for a chunk, or `[DONE]`) as a plain string, or an `SseError`.
# A data event is the string itself, not an object around it: a stream's every chunk is one,
# and an object's constructor is a Python call per chunk on the event loop (issue 15).
SseEvent = str | SseError


def _lines_of(text: str) -> list[str]:
    """`text` cut at its line ends (CRLF, CR or LF); the last item is what follows the last."""
    return _LINE_END_RE.split(text) if "\r" in text else text.split("\n")


def sse_events(lines: Iterable[str]) -> Iterator[SseEvent]:
    """Frame decoded lines (without their line ends) into events, as the SSE spec reads them.

    `data:` lines of one event are joined with newlines; comments (`: keep-alive`) and other
    fields (`event:`, `id:`, `retry:`) carry nothing for a chat completion and are skipped.
    """
    decoder = SseDecoder()
    yield from decoder.lines(lines)
    yield from decoder.close()


class SseDecoder:
    """Server-Sent Events from a body's bytes as they arrive, in chunks cut anywhere.

    Lines end with CRLF, LF or CR (a CR ending one chunk and the LF opening the next are one
    line end); the text is UTF-8, a leading BOM dropped and invalid bytes replaced, as the SSE
    spec reads it. A line, and the data of one event, may be as long as `limit` characters:
    a server that sends more without ending it fails the stream with a clear error rather than
    filling the memory (there is no other limit, such as aiohttp's 64 KiB `readline`).

    The bytes are decoded by `codecs.utf_8_decode` itself, which leaves a character cut by the
    piece's end for the next piece (`_cut`): exactly what the codec's incremental decoder does,
    without its two Python frames a piece; the BOM, read as U+FEFF, is dropped from the text.
    """

    def __init__(self, *, limit: int = EVENT_LIMIT_CHARS) -> None:
        self.limit = limit
        self._cut = b""  # the bytes of a character the last piece cut off
        self._started = False  # text has come (a BOM can only lead the first)
        self._rest: list[str] = []  # the pieces of a line whose end has not come yet
        self._rest_size = 0
        self._after_cr = False  # the text so far ended with CR: a LF next is its line end
        self._data: list[str] = []
        self._error: list[str] = []
        self._size = 0  # characters in `_data` and `_error`, a line end counted for each line

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """The events that this piece of the body completes. Each character is looked at once
        (line ends are sought in the new text only, a line's pieces joined when it ends): a
        long line in many pieces costs its length, not its length times its pieces."""
        if self._cut:
            chunk = self._cut + chunk
        text, used = _utf8_decode(chunk, "replace")
        self._cut = chunk[used:]
        if not text:
            return []
        if not self._started:
            self._started = True
            if text[0] == "\ufeff":
                text = text[1:]
        if self._after_cr:
            self._after_cr = False
            if text[:1] == "\n":
                text = text[1:]
        if not text:
            return []
        lines = _lines_of(text)
        self._after_cr = text[-1] == "\r"
        last = lines.pop()
        if lines:
            if self._rest:
                lines[0] = "".join([*self._rest, lines[0]])
                self._rest, self._rest_size = [], 0
        if last:
            self._rest.append(last)
            self._rest_size += len(last)
            if self._rest_size > self.limit:
                raise AgentError(self._too_long("line"))
        return self.lines(lines) if lines else []

    def lines(self, lines: Iterable[str]) -> list[SseEvent]:
        """The events that these whole lines (without their line ends) complete."""
        out: list[SseEvent] = []
        data, error = self._data, self._error
        for line in lines:
            if not line:
                if error:
                    out.append(SseError("\n".join(error)))
                    error.clear()
                if data:
                    out.append("\n".join(data))
                    data.clear()
                self._size = 0
                continue
            if line[0] == ":":
                continue
            name, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if name == "data":
                data.append(value)
            elif name == "error":
                error.append(value)
            else:
                continue
            self._size += len(value) + 1
        if self._size > self.limit:
            raise AgentError(self._too_long("event"))
        return out

    def close(self) -> list[SseEvent]:
        """The end of the body: a last line without its line end, and an event cut off by the
        end of the body, still count."""
        # A character cut off at the very end: U+FFFD (never a line end, nor a BOM).
        rest = "".join([*self._rest, _utf8_decode(self._cut, "replace", True)[0]])
        self._cut, self._rest, self._rest_size = b"", [], 0
        return (self.lines([rest]) if rest else []) + self.lines([""])

    def _too_long(self, what: str) -> str:
        return (
            f"The language model server sent a stream {what} longer than {self.limit:,} characters."
        )


def server_error_text(payload: Any) -> str | None:
    """The message of an error object a server streamed instead of a chunk, if it is one.

    Shapes seen: `{"error": {"message": …}}` (OpenAI, current vLLM, llama.cpp since late 2025,
    Ollama), `{"object": "error", "message": …}` (vLLM before 2025), and a bare
    `{"code", "message", "type"}` object in llama.cpp's `error:` field.
    """
    if not isinstance(payload, dict):
        return None
    error = payload.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type") or "unknown error")
    if isinstance(error, str) and error:
        return error
    if payload.get("object") == "error" or ("message" in payload and "choices" not in payload):
        return str(payload.get("message") or "unknown error")
    return None


# --- chunks ----------------------------------------------------------------------------------
@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: str = ""

    def arguments_complete(self) -> bool:
        try:
            return isinstance(json.loads(self.arguments), dict)
        except ValueError:
            return False


class _ThinkTags:
    """Reasoning a model writes into its content as a leading `<think>…</think>` block (servers
    without a reasoning parser, e.g. Ollama before 0.9 with DeepSeek-R1 or Qwen3).

    A plain class whose state starts as class attributes: made for every request, it is built
    without a Python call (a dataclass's `__init__` is one)."""

    state = "start"  # start → thinking → answer, or start → answer
    pending = ""

    OPEN = "<think>"
    CLOSE = "</think>"

    def split(self, text: str) -> tuple[str, str]:
        """(reasoning, answer) in this piece of content."""
        if self.state == "answer":
            return "", text
        self.pending += text
        if self.state == "start":
            head = self.pending.lstrip()
            if head.startswith(self.OPEN):
                self.state = "thinking"
                self.pending = head[len(self.OPEN) :]
            elif self.OPEN.startswith(head):
                return "", ""  # could still become "<think>"
            else:
                self.state, answer, self.pending = "answer", self.pending, ""
                return "", answer
        end = self.pending.find(self.CLOSE)
        if end >= 0:
            reasoning, answer = self.pending[:end], self.pending[end + len(self.CLOSE) :]
            self.state, self.pending = "answer", ""
            return reasoning, answer.lstrip()
        keep = _partial_suffix(self.pending, self.CLOSE)
        reasoning = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep :]
        return reasoning, ""

    def close(self) -> tuple[str, str]:
        pending, self.pending = self.pending, ""
        if self.state == "thinking":
            return pending, ""
        return "", pending


def _partial_suffix(text: str, marker: str) -> int:
    """How many characters at the end of `text` could begin `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


@dataclass
class ChunkParser:
    """Assembles one streamed chat completion (choice 0) from its chunks.

    Tool calls are assembled by `index`, but real servers bend that rule, so a fragment starts
    a new call also when it carries another `id`, or a name while the call at its index already
    has a name and complete JSON arguments (Groq and old Ollama reuse index 0 for every call;
    old Ollama sends no index at all, so the position in the chunk's list stands in for it).
    A repeated id (LiteLLM sends it on every fragment) continues the call, and a fragment that
    repeats a finished call whole is ignored.
    """

    finished: bool = False
    finish_reason: str | None = None
    usage: Usage | None = None
    done: bool = False  # `[DONE]` arrived (`feed_events`)
    _calls: list[_Call] = field(default_factory=list)
    _open: dict[int, _Call] = field(default_factory=dict)
    _thinking: str = ""
    _think_tags: _ThinkTags = field(default_factory=_ThinkTags)

    def feed(self, chunk: Mapping[str, Any]) -> list[StreamItem]:
        """What one chunk completes; an error object a server streamed raises `AgentError`
        with its words (`chunk_checked`). The error check and the choice are read here, not
        in calls of their own: each would be a Python call a chunk on the event loop (issue
        15), and models stream a token a chunk."""
        if (
            chunk.__class__ is not dict
            or "error" in chunk
            or "message" in chunk
            or chunk.get("object") == "error"
        ):
            chunk = chunk_checked(chunk)
        out: list[StreamItem] = []
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = _usage(usage) or self.usage
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not (isinstance(choice, dict) and choice.get("index", 0) in (0, None)):
                continue
            delta = choice.get("delta")
            # Each field but the content is looked up only when the delta has its key (`in`
            # is no call): a model streams its answer a token a chunk, each a content alone.
            if isinstance(delta, dict):  # Azure's content-filter chunks carry none
                if "reasoning_content" in delta or "reasoning" in delta:
                    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                    if isinstance(reasoning, str):
                        self._thinking += reasoning
                        self._flush_thinking(out, everything=False)
                for key in ("content", "refusal") if "refusal" in delta else ("content",):
                    text = delta.get(key)
                    if isinstance(text, str) and text:
                        # Once the answer has begun there are no think tags to look for (a call
                        # less a chunk: a model streams its answer a token a chunk).
                        tags = self._think_tags
                        thought, answer = ("", text) if tags.state == "answer" else tags.split(text)
                        if thought:
                            self._thinking += thought
                            self._flush_thinking(out, everything=False)
                        if answer:
                            if self._thinking:
                                self._flush_thinking(out, everything=True)
                            out.append(TextDelta(answer))
                if "tool_calls" in delta:
                    fragments = delta["tool_calls"]
                    if isinstance(fragments, list) and fragments:
                        if self._thinking:
                            self._flush_thinking(out, everything=True)
                        for position, fragment in enumerate(fragments):
                            if isinstance(fragment, dict):
                                self._fragment(fragment, position)
                if "function_call" in delta:
                    legacy = delta["function_call"]
                    if isinstance(legacy, dict):
                        if self._thinking:
                            self._flush_thinking(out, everything=True)
                        self._fragment({"index": _LEGACY_FUNCTION_INDEX, "function": legacy}, 0)
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self.finished, self.finish_reason = True, reason
        return out

    def feed_events(self, events: Iterable[SseEvent]) -> Iterator[StreamItem]:
        """Feed the stream's SSE events up to `[DONE]` (which sets `done`), each event's items
        given before the next is read: an `error` event raises with the server's words after
        the text that came before it in the same piece of the body."""
        for event in events:
            if event.__class__ is not str:
                raise AgentError(server_error_message(event.error))
            if event == DONE:
                self.done = True
                return
            try:
                chunk = orjson.loads(event)
            except orjson.JSONDecodeError:
                chunk = chunk_decode(event)  # what only `json` reads, or a malformed stream
            yield from self.feed(chunk)

    def close(self, *, done: bool) -> list[StreamItem]:
        """End of the body; `done` says whether `[DONE]` arrived. A stream that neither finished
        a choice nor said `[DONE]` was cut off, and raises."""
        if not (self.finished or done):
            raise AgentError("The language model stream ended before it was complete.")
        out: list[StreamItem] = []
        answer = ""
        if self._think_tags.pending:  # a think block, or what could begin one, left open
            reasoning, answer = self._think_tags.close()
            self._thinking += reasoning
        if self._thinking:
            self._flush_thinking(out, everything=True)
        if answer:
            out.append(TextDelta(answer))
        for n, call in enumerate(self._calls):
            if not call.name:
                raise AgentError("The language model sent a tool call without a name.")
            out.append(
                ToolCallRequest(id=call.id or f"call_{n}", name=call.name, arguments=call.arguments)
            )
        if self.usage is not None:
            out.append(self.usage)
        return out

    def _flush_thinking(self, out: list[StreamItem], *, everything: bool) -> None:
        """Reasoning goes out a paragraph at a time (a model streams it word by word; the
        activity log shows one entry per `Thinking`), and whole when the answer begins."""
        if not self._thinking:
            return
        if everything:
            cut = len(self._thinking)
        else:
            paragraphs = list(_PARAGRAPH_RE.finditer(self._thinking))
            if paragraphs:
                cut = paragraphs[-1].end()
            elif len(self._thinking) >= THINKING_FLUSH_CHARS:
                cut = max(self._thinking.rfind(" "), 1)
            else:
                return
        text, self._thinking = self._thinking[:cut].strip(), self._thinking[cut:]
        for paragraph in _PARAGRAPH_RE.split(text):
            if paragraph.strip():
                out.append(Thinking(paragraph.strip()))

    def _fragment(self, fragment: Mapping[str, Any], position: int) -> None:
        index = fragment.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            index = position
        function = fragment.get("function")
        function = function if isinstance(function, dict) else {}
        call_id = fragment.get("id") if isinstance(fragment.get("id"), str) else ""
        name = function.get("name") if isinstance(function.get("name"), str) else ""
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # an object instead of JSON text
            arguments = json.dumps(arguments, ensure_ascii=False)
        arguments = arguments if isinstance(arguments, str) else ""

        call = self._open.get(index)
        if call is not None and call_id and call_id == call.id and name == call.name:
            if arguments and arguments == call.arguments and call.arguments_complete():
                return  # the whole call again (a proxy's summary of what it streamed)
        if call is None or self._starts_new(call, call_id, name):
            call = _Call()
            self._calls.append(call)
            self._open[index] = call
        if call_id and not call.id:
            call.id = call_id
        if name and not call.name:
            call.name = name
        call.arguments += arguments

    @staticmethod
    def _starts_new(call: _Call, call_id: str, name: str) -> bool:
        if call_id and call.id and call_id != call.id:
            return True
        return bool(name and call.name and not call_id and call.arguments_complete())


# The most tokens one request's usage may report: more is no model's (the turn's row sums a
# turn's requests in 64-bit integers; a server's 2**63 failed the statement, review 29-a H1).
TOKENS_REPORTED_MAX = 2**31 - 1


def _usage(usage: Mapping[str, Any]) -> Usage | None:
    """The request's tokens, when the server reported two counts a model could use."""
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if (
        isinstance(prompt, int)
        and isinstance(completion, int)
        and prompt <= TOKENS_REPORTED_MAX
        and completion <= TOKENS_REPORTED_MAX
    ):
        return Usage(prompt_tokens=prompt, completion_tokens=completion)
    return None


def stream_parse(events: Iterable[SseEvent]) -> list[StreamItem]:
    """A whole stream's events at once (tests and tools; the agent feeds as chunks arrive)."""
    parser = ChunkParser()
    out = list(parser.feed_events(events))
    return out + parser.close(done=parser.done)


def chunk_decode(data: str) -> Mapping[str, Any]:
    """One event's JSON; a streamed error object raises `AgentError` with the server's words."""
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        # What orjson refuses and `json` reads: lone surrogates, NaN (orjson reads an integer
        # past 64 bits as a float). Nesting too deep for orjson is too deep for `json` too.
        try:
            payload = _well_formed(json.loads(data))
        except (ValueError, RecursionError):
            raise AgentError("The language model server sent a malformed stream.") from None
    return chunk_checked(payload)


def chunk_checked(payload: Any) -> Mapping[str, Any]:
    """A decoded event as a chunk; a streamed error object raises `AgentError` with the
    server's words, anything but an object that the stream is malformed."""
    message = server_error_text(payload)
    if message is not None:
        raise AgentError(server_error_message(message))
    if not isinstance(payload, dict):
        raise AgentError("The language model server sent a malformed stream.")
    return payload


def _well_formed(value: Any) -> Any:
    """`value` with each lone surrogate (half an emoji a server's tokenizer cut off from the
    other half) replaced by U+FFFD: text that cannot be encoded broke the SSE response and the
    message's insert, and the turn ended with no `turn_end`."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {_well_formed(key): _well_formed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_well_formed(item) for item in value]
    return value


def server_error_message(text: str, *, limit: int = 300) -> str:
    """The readable sentence for an error the server reported (JSON or plain text)."""
    try:
        text = server_error_text(json.loads(text)) or text
    except ValueError:
        pass
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = text[:limit] + "…"
    return f"The language model server reported an error: {text}"
