"""The `fake_llm` fixture: one fake OpenAI-compatible server per test session, reset per test.

Point the app at it with `GEOSENSE_LLM_BASE_URL=fake_llm.base_url` (for a live server, pass
that in `daphne_server_factory(env=...)`); queue answers with `reply_text`, `reply_tool_calls`,
`fail`, `break_off` or `reply(...)`; read what the model was fed from `fake_llm.requests`.
"""

from collections.abc import Iterator

import pytest

from tests.fakes.fake_openai import FakeOpenAI


@pytest.fixture(scope="session")
def fake_llm_server() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    yield server
    server.stop()


@pytest.fixture
def fake_llm(fake_llm_server: FakeOpenAI) -> Iterator[FakeOpenAI]:
    fake_llm_server.reset()
    yield fake_llm_server
    fake_llm_server.reset()
