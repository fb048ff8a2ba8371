"""Costly answers and registrations a hostile browser can send, and the loops that send them.

A hostile page declares its client tools itself, so it picks result schemas that are slow to
check and answers with values made to be slow against them. Each schema comes with the answer
that is worst for it; the attacker registers them worst first and uses the first one the
server admits.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.browser.daphne_server import DaphneServer
from tests.security.live import Account, frame_next, http, socket_bound, sse_events

DESCRIPTION = "The user's position."


@dataclass(frozen=True)
class CostlyResult:
    name: str
    schema: dict[str, Any]
    value: dict[str, Any]


def _objects(n: int) -> list[dict[str, int]]:
    return [{"k": i} for i in range(n)]


COSTLY_RESULTS = [
    # The stock check compares every pair of objects: quadratic (the issue's reproduction).
    CostlyResult(
        "uniqueItems over 2,700 objects (24 KiB)",
        {"type": "object", "properties": {"v": {"type": "array", "uniqueItems": True}}},
        {"v": _objects(2700)},
    ),
    # Distinct strings: the whole array must be compared.
    CostlyResult(
        "uniqueItems over 9,000 distinct strings (62 KiB)",
        {
            "type": "object",
            "properties": {
                "v": {"type": "array", "uniqueItems": True, "items": {"type": "string"}}
            },
        },
        {"v": [str(i) for i in range(9000)]},
    ),
    # Every item is checked against every branch until the last one matches: schema size
    # times answer size, and a valid answer gives the check no early way out.
    CostlyResult(
        "a 300-branch anyOf matched by its last branch, for 5,800 items (63 KiB)",
        {
            "type": "object",
            "properties": {
                "v": {
                    "type": "array",
                    "items": {
                        "anyOf": [{"type": "object", "required": [f"k{j}"]} for j in range(300)]
                    },
                }
            },
        },
        {"v": [{"k299": 0}] * 5800},
    ),
]


def location_declaration(result_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "blocking",
        "name": "location_get",
        "description": DESCRIPTION,
        "arguments": {"type": "object", "properties": {}},
        "result": result_schema,
        "serve": True,
    }


def heavy_declaration(name: str) -> dict[str, Any]:
    """A declaration just under the 16 KiB limit, as many small subschemas as fit; each name
    gives other property names, so no check can be answered from a cache."""
    properties = {
        f"{name}_{j}": {
            "type": "object",
            "properties": {"a": {"type": "array", "items": {"minimum": 0}}},
        }
        for j in range(150)
    }
    return {
        "kind": "one-way",
        "name": name,
        "description": "x",
        "arguments": {"type": "object", "properties": properties},
    }


def heavy_frames(count: int, *, max_chars: int) -> list[str]:
    """`count` register frames, each of as many heavy declarations as fit in `max_chars`, and
    each with names of its own (so no frame's check can be answered from a cache)."""
    tools: list[dict[str, Any]] = []
    template = ""
    while True:
        more = [*tools, heavy_declaration(f"hSERIALx{len(tools)}")]
        frame = json.dumps({"type": "client-tool-register", "tools": more})
        # the serial replaces "SERIAL" in every property name: room for its digits
        if len(frame) + frame.count("SERIAL") * len(str(count)) > max_chars:
            break
        tools, template = more, frame
    return [template.replace("SERIAL", str(serial)) for serial in range(count)]


@dataclass
class Tally:
    """What an attack sent and how the server answered each kind of frame."""

    sent: int = 0
    answers: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)


async def registration_flood(
    server: DaphneServer, who: Account, *, frames: int, seconds: float, max_chars: int = 80 * 1024
) -> Tally:
    """Send `frames` register frames of distinct heavy declarations, each as large as a frame
    may be, evenly over `seconds`, and count how the server answered by then."""
    tally = Tally()
    ws = await socket_bound(server, who)
    payloads = heavy_frames(frames, max_chars=max_chars)
    started = time.monotonic()
    deadline = started + seconds

    async def read() -> None:
        while True:
            frame = await frame_next(ws, within=seconds + 60)
            status = f" {frame.get('status')}" if "status" in frame else ""
            tally.answers[frame["type"] + status] += 1

    reader = asyncio.create_task(read())
    try:
        for serial, payload in enumerate(payloads):
            await asyncio.sleep(max(0.0, started + serial * seconds / frames - time.monotonic()))
            try:
                await asyncio.wait_for(ws.send(payload), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                tally.notes.append("the server stopped reading the socket")
                break
            tally.sent += 1
        await asyncio.sleep(max(0.0, deadline - time.monotonic()) + 1)
    finally:
        reader.cancel()
        await ws.close()
    return tally


async def costly_answers(server: DaphneServer, who: Account, *, seconds: float) -> Tally:
    """Register location_get with the costliest admitted result schema, then keep asking
    "where am I?" (the local agent calls location_get) and answer with the costliest value."""
    tally = Tally()
    ws = await socket_bound(server, who)
    chosen = None
    for costly in COSTLY_RESULTS:
        await ws.send(
            json.dumps(
                {"type": "client-tool-register", "tools": [location_declaration(costly.schema)]}
            )
        )
        frame = await frame_next(ws)
        if frame["type"] == "error":
            tally.notes.append(f"refused at registration: {costly.name}: {frame['error']}")
            continue
        chosen = costly
        break
    assert chosen is not None, tally.notes
    tally.notes.append(f"answered with: {chosen.name}")
    answer = json.dumps({"type": "client-tool-result", "result": chosen.value})
    deadline = time.monotonic() + seconds
    slack = seconds + 30  # a stalled server is an outcome to count, not a hang
    try:
        while time.monotonic() < deadline:
            turn = asyncio.create_task(
                asyncio.to_thread(
                    http,
                    server,
                    "POST",
                    f"/api/sessions/{who.session}/message/stream",
                    token=who.token,
                    body={"text": "where am I?"},
                    timeout=slack,
                )
            )
            try:
                while (frame := await frame_next(ws, within=slack))["type"] != "client-tool-invoke":
                    if frame["type"] == "error":
                        tally.answers[f"error {frame['status']}"] += 1
                await ws.send(
                    answer.replace(
                        '"result"', f'"correlationId": "{frame["correlationId"]}", "result"', 1
                    )
                )
                tally.sent += 1
                done = await turn
            except (TimeoutError, OSError) as exc:
                tally.answers[f"no answer within {slack:g} s ({type(exc).__name__})"] += 1
                break
            events = sse_events(done.body)
            if any(name == "error" for name, _ in events) or done.status != 200:
                tally.answers[f"turn failed ({done.status})"] += 1
            elif "could not be checked" in done.body.decode():
                tally.answers["turn answered: the answer was refused as too costly"] += 1
            elif "No answer from the client" in done.body.decode():
                tally.answers[
                    "turn answered: the answer was dropped (429), the call timed out"
                ] += 1
            else:
                tally.answers["turn answered"] += 1
    finally:
        await ws.close()
    return tally
