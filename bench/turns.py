"""Turn streaming latency and throughput through the real SSE endpoint.

Run by hand: `.venv/bin/python bench/turns.py [--events 2000] [--runs 15]`.

Set-up (all on loopback, one machine): a fake OpenAI-compatible server in this process streams
as fast as it can; a Daphne process runs GeoSense with the `openai` agent pointed at it; this
process is the HTTP client. Measured, side by side in one run:
- first-delta latency: the fake receiving the model request → the client reading the first
  `text_delta` from GeoSense, against the same fake read directly by the `openai` client
  (the fake receiving the request → the client reading the first content chunk);
- throughput: events per second of a turn that streams N deltas, and the time GeoSense adds
  per event = (GeoSense turn time - direct stream time) / N.
"""

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import openai

from tests.browser.daphne_server import seeded_database, start_server
from tests.fakes.fake_openai import FakeOpenAI, Text


class TimedFake(FakeOpenAI):
    """Records when each model request arrived (just before its first chunk is written)."""

    arrivals: list[float]

    def next_response(self, body, headers=None):
        self.arrivals.append(time.perf_counter())
        return super().next_response(body, headers)


def _post_stream(url: str, token: str, path: str, body: dict) -> tuple[float | None, int, float]:
    """(time of the first text_delta, number of events, time of turn_end)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request(
        "POST",
        path,
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    response = conn.getresponse()
    assert response.status == 200, response.read()
    first, events = None, 0
    while True:
        line = response.readline()
        if not line:
            break
        if line.startswith(b"event: "):
            events += 1
            name = line[7:].strip()
            if name == b"text_delta" and first is None:
                first = time.perf_counter()
            if name == b"turn_end":
                end = time.perf_counter()
                break
    conn.close()
    return first, events, end


def _direct(fake: TimedFake, client: openai.OpenAI) -> tuple[float, float, int]:
    sent = time.perf_counter()
    first = None
    chunks = 0
    with client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hi"}], stream=True
    ) as stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                chunks += 1
                if first is None:
                    first = time.perf_counter()
    return first - fake.arrivals[-1], time.perf_counter() - sent, chunks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=2000, help="text deltas per streamed turn")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    fake = TimedFake()
    fake.arrivals = []
    fake.start()
    work = Path(tempfile.mkdtemp(prefix="bench-turns-"))
    db = seeded_database(work / "db.sqlite3")
    server = start_server(
        db_path=db,
        log_path=work / "daphne.log",
        extra_env={"GEOSENSE_LLM_BASE_URL": fake.base_url, "GEOSENSE_LLM_MODEL": "fake-model"},
    )
    try:
        token = server.manage("api_token", "demo").strip()
        direct = openai.OpenAI(base_url=fake.base_url, api_key="x", max_retries=0)
        text = "word " * args.events

        first_geosense, first_direct, per_event_added, rates = [], [], [], []
        for _ in range(args.runs):
            conn = http.client.HTTPConnection("127.0.0.1", server.port)
            conn.request(
                "POST",
                "/api/sessions",
                body="{}",
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            session = json.loads(conn.getresponse().read())["id"]
            conn.close()
            path = f"/api/sessions/{session}/message/stream"

            # first-delta latency: a one-chunk answer
            fake.reply(Text("hello", 1))
            first, _, _ = _post_stream(server.url, token, path, {"text": "hi"})
            first_geosense.append(first - fake.arrivals[-1])
            fake.reply(Text("hello", 1))
            first_direct.append(_direct(fake, direct)[0])

            # throughput: N deltas through GeoSense, and the same N read directly
            fake.reply(Text(text, args.events))
            started = time.perf_counter()
            _, events, end = _post_stream(server.url, token, path, {"text": "stream"})
            geosense_time = end - started
            fake.reply(Text(text, args.events))
            _, direct_time, chunks = _direct(fake, direct)
            assert chunks == args.events
            rates.append(events / geosense_time)
            per_event_added.append((geosense_time - direct_time) / args.events)

        def ms(values):
            return f"{statistics.median(values) * 1000:.2f} ms"

        print(f"runs: {args.runs}, deltas per streamed turn: {args.events}")
        print(
            f"first text_delta after the model's first chunk, through GeoSense: median {ms(first_geosense)}"
        )
        print(
            f"first content chunk read directly from the fake (openai client):   median {ms(first_direct)}"
        )
        print(f"events per second through the SSE endpoint: median {statistics.median(rates):,.0f}")
        print(
            f"time GeoSense adds per event: median {statistics.median(per_event_added) * 1e6:.0f} µs"
        )
    finally:
        server.stop()
        fake.stop()


if __name__ == "__main__":
    main()
