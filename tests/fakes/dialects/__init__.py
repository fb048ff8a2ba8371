"""Chat-completion streams as the servers people run send them, byte for byte.

Each `<dialect>/<name>.sse` file is a streamed response body, written from the server's own
source and documentation and from the issue threads that show its real traffic (the `source`
of each recording names them; docs/models.md describes every dialect). The fake server replays
a file verbatim (`fake_openai.Raw`), so the real `openai` agent and the turn engine read it as
they would read the server.

The recordings that call tools call `list_classes` (no arguments) and `measure` (`{"id": 7}`):
on an empty dataset both answer deterministically (`{"counts": {}, "total": 0}` and "There is
no annotation 7."), so a test can check the stored transcript and the next request exactly.
A tool-calling recording is followed by its dialect's `ANSWERS` recording.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
ANSWER_TEXT = "There are no annotations yet."


@dataclass(frozen=True)
class Recording:
    dialect: str
    name: str
    source: str
    text: str = ""
    thinking: tuple[str, ...] = ()
    calls: tuple[tuple[str, str, str], ...] = ()  # (id as the agent yields it, name, arguments)
    usage: tuple[int, int] | None = None  # (prompt, completion) tokens
    error: str | None = None  # what the user is told when the stream reports a failure

    @property
    def wire(self) -> bytes:
        return (HERE / self.dialect / f"{self.name}.sse").read_bytes()

    @property
    def id(self) -> str:
        return f"{self.dialect}/{self.name}"


LIST = ("list_classes", "{}")
RECORDINGS = (
    # --- OpenAI -------------------------------------------------------------------------------
    Recording(
        "openai",
        "text",
        "OpenAI API reference, chat streaming: a role chunk, content deltas, an empty delta with "
        "finish_reason, `usage: null` on every chunk and a final usage chunk with empty choices "
        "when stream_options.include_usage is set; the `obfuscation` padding field (2025).",
        text=ANSWER_TEXT,
        usage=(812, 9),
    ),
    Recording(
        "openai",
        "parallel-tool-calls",
        "OpenAI function-calling guide, streaming: each call's id, type and name arrive once in "
        'its first fragment (arguments ""), the arguments follow in pieces keyed by index; '
        "finish_reason tool_calls (captures in openai/openai-python#1677, simonw/llm#988).",
        calls=(
            ("call_qYmeTNXmU9FH9xPm", *LIST),
            ("call_Dcuer5y2RowXl7Ig", "measure", '{"id": 7}'),
        ),
        usage=(812, 9),
    ),
    Recording(
        "openai",
        "legacy-function-call",
        "The deprecated functions API: `delta.function_call` with no id, finish_reason "
        "function_call; servers built on the older spec still answer this way.",
        calls=(("call_0", *LIST),),
    ),
    # --- vLLM ---------------------------------------------------------------------------------
    Recording(
        "vllm",
        "reasoning",
        'vllm/entrypoints/openai/chat_completion/serving.py: first chunk role + content "", '
        "`reasoning` deltas (the field name since 2025), a finish chunk with stop_reason, a usage "
        "chunk serialised with exclude_none; `: keep-alive` comments (--sse-keep-alive-interval, "
        "vllm-project/vllm#51034).",
        thinking=(
            "The user asks what is here. The overview says there are none.",
            "So I answer directly.",
        ),
        text=ANSWER_TEXT,
        usage=(840, 31),
    ),
    Recording(
        "vllm",
        "reasoning-content",
        "vLLM before 2025 (docs 0.7–0.9, reasoning outputs): the reasoning parser streams "
        "`reasoning_content` deltas.",
        thinking=("Nothing is mapped yet.",),
        text=ANSWER_TEXT,
    ),
    Recording(
        "vllm",
        "tool-calls-without-ids",
        "vllm-project/vllm#18412: with some tool parsers the streamed calls carry no id.",
        calls=(("call_0", *LIST), ("call_1", "measure", '{"id": 7}')),
        usage=(840, 31),
    ),
    Recording(
        "vllm",
        "tool-calls-without-finish-reason",
        "vllm-project/vllm#27572, waybarrios/vllm-mlx#672: a tool call in one fragment, then "
        "`[DONE]` without any chunk carrying finish_reason.",
        calls=(("chatcmpl-tool-040af537f3e14bd6", *LIST),),
    ),
    Recording(
        "vllm",
        "error-mid-stream",
        'create_streaming_error_response: `data: {"error": {…}}` then `[DONE]`, at HTTP 200.',
        error="The decoder prompt (length 9000) is longer than the maximum model length of 8192.",
    ),
    Recording(
        "vllm",
        "error-object",
        'vLLM\'s ErrorResponse before 2025: `{"object": "error", "message", "type", "code"}`.',
        error="Engine loop has died",
    ),
    # --- Ollama -------------------------------------------------------------------------------
    Recording(
        "ollama",
        "thinking",
        'ollama/openai/openai.go (2026): `reasoning` deltas with content "", a finish chunk with '
        "an empty delta, the usage chunk with empty choices.",
        thinking=("Okay, the user wants to know what is mapped.",),
        text=ANSWER_TEXT,
        usage=(795, 24),
    ),
    Recording(
        "ollama",
        "tool-calls",
        "ollama/openai/openai.go ToToolCalls: each call whole in one chunk (id, index, name, "
        "arguments), finish_reason tool_calls.",
        calls=(("call_8ztdlw3x", *LIST), ("call_k2m9q0vb", "measure", '{"id":7}')),
        usage=(795, 24),
    ),
    Recording(
        "ollama",
        "legacy-tool-calls",
        "Ollama before 0.5 (openai.go before ollama/ollama#7888): role in every delta, several "
        "calls in one chunk without index, finish_reason stop although tools were called.",
        calls=(("call_ybq1mnw7", *LIST), ("call_3r9dk2le", "measure", '{"id":7}')),
    ),
    Recording(
        "ollama",
        "think-tags-in-content",
        "Before Ollama's thinking support (0.9), DeepSeek-R1 and Qwen3 wrote their reasoning into "
        "the content inside <think>…</think>, split anywhere by the token stream.",
        thinking=("The map is empty.",),
        text=ANSWER_TEXT,
    ),
    # --- llama.cpp ----------------------------------------------------------------------------
    Recording(
        "llamacpp",
        "reasoning",
        "tools/server/server-task.cpp: first chunk content null, `reasoning_content` deltas, "
        "an empty-delta finish chunk, the usage chunk with `timings`; colon-only ping comments "
        "(b9478, ollama/ollama#16443); `[DONE]` without the closing blank line "
        "(darshi1337/apogee#139).",
        thinking=("No annotations are loaded.",),
        text=ANSWER_TEXT,
        usage=(812, 28),
    ),
    Recording(
        "llamacpp",
        "tool-calls",
        "common_chat_msg_diff_to_json_oaicompat: id and type only in a call's first fragment, "
        "`function.arguments` in every fragment; no usage without stream_options.",
        calls=(
            ("Kq3LbP0aWcXyZ1dEfGhIjKlMnOpQrStU", *LIST),
            ("Vw4XyZ5aBcDeFgHiJkLmNoPqRsTuVwXy", "measure", '{"id":7}'),
        ),
    ),
    Recording(
        "llamacpp",
        "error-field",
        "llama.cpp builds through 2025 report a failure at HTTP 200 as a non-standard `error:` "
        "field (ggml-org/llama.cpp#16109, coddy-project/coddy-agent#106).",
        error="the request exceeds the available context size. try increasing the context size or enable context shift",
    ),
    # --- LiteLLM ------------------------------------------------------------------------------
    Recording(
        "litellm",
        "reasoning",
        "LiteLLM proxy: `reasoning_content` with `thinking_blocks`, null delta fields, usage on a "
        "chunk after the finish and a last chunk with empty choices (BerriAI/litellm#17136); "
        "`: ping` keep-alives (BerriAI/litellm#37322).",
        thinking=("The user asks what is mapped.",),
        text=ANSWER_TEXT,
        usage=(1020, 40),
    ),
    Recording(
        "litellm",
        "tool-calls",
        "BerriAI/litellm#20480: the call's id repeated on every fragment; text before the calls; "
        "an empty chunk after finish_reason (agno-agi/agno#3826).",
        text="Let me check.",
        calls=(("toolu_01A9hVbq7", *LIST), ("toolu_01Bx2mRkd", "measure", '{"id": 7}')),
        usage=(1187, 61),
    ),
    Recording(
        "litellm",
        "index-reused",
        "Groq through LiteLLM (BerriAI/litellm#7621): every call whole in its own chunk, each "
        "with index 0 and its own id.",
        calls=(("call_785j", *LIST), ("call_9zx1", "measure", '{"id":7}')),
    ),
    # --- Azure OpenAI -------------------------------------------------------------------------
    Recording(
        "azure",
        "text",
        "Azure OpenAI content filtering: a first chunk with empty choices and "
        "prompt_filter_results (AbanteAI/mentat#429); content_filter_results on chunks; the "
        "asynchronous filter's chunk without `delta` after the finish (microsoft/autogen#6465).",
        text=ANSWER_TEXT,
        usage=(806, 8),
    ),
    Recording(
        "azure",
        "tool-calls",
        "Azure OpenAI: OpenAI's tool-call fragments behind the prompt-filter chunk.",
        calls=(
            ("call_A1b2C3d4E5f6G7h8", *LIST),
            ("call_I9j0K1l2M3n4O5p6", "measure", '{"id": 7}'),
        ),
    ),
)

ANSWERS = {
    "openai": "text",
    "vllm": "reasoning",
    "ollama": "thinking",
    "llamacpp": "reasoning",
    "litellm": "reasoning",
    "azure": "text",
}


def recording(dialect: str, name: str) -> Recording:
    return next(r for r in RECORDINGS if r.dialect == dialect and r.name == name)
