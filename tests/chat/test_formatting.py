"""Measures read the same on the server and the page: chat/markup/formatting.py and
static/geosense/format.js format one table of cases (tests/formatting_cases.json, which
tests/js/format.test.mjs reads too), and thousands of generated values through both."""

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from chat.markup.formatting import FORMATTERS

ROOT = Path(__file__).resolve().parent.parent.parent
CASES = json.loads((ROOT / "tests" / "formatting_cases.json").read_text())
FORMAT_JS = ROOT / "static" / "geosense" / "format.js"

# Formats every [format, value] pair of stdin with format.js and prints the texts as JSON;
# for `null` it prints the names of its formatters.
NODE_FORMAT = f"""
import {{ FORMATTERS }} from {json.dumps(FORMAT_JS.as_uri())};
let input = '';
for await (const chunk of process.stdin) input += chunk;
const pairs = JSON.parse(input);
const out = pairs === null
  ? Object.keys(FORMATTERS)
  : pairs.map(([format, value]) => FORMATTERS[format](value));
process.stdout.write(JSON.stringify(out));
"""


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c['format']}({json.dumps(c['value'])})" for c in CASES]
)
def test_the_server_formats_each_case_of_the_shared_table(case):
    assert FORMATTERS[case["format"]](case["value"]) == case["text"]


def test_the_table_covers_every_formatter_of_both_sides():
    assert {c["format"] for c in CASES} == set(FORMATTERS)
    assert set(json.loads(_node_run(None))) == set(FORMATTERS)


def _values(seed: int = 14) -> list[float]:
    """Numbers around every boundary and rounding tie the formatters have, and random ones."""
    rng = random.Random(seed)
    values: list[float] = []
    for exponent in range(-4, 9):
        for mantissa in range(0, 1000, 7):
            values.append(mantissa / 8 * 10.0**exponent)  # exact binary ties: 0.125, 2.5 …
        for boundary in (1, 10, 100, 1000, 10_000, 100_000, 1_000_000):
            values += [boundary * (1 - 10.0**exponent / 1e9), boundary * (1 + 10.0**exponent / 1e9)]
    values += [rng.uniform(-2e6, 2e6) for _ in range(1500)]
    values += [rng.lognormvariate(0, 6) for _ in range(1500)]
    return values + [-v for v in values[:500]]


def _node_run(pairs: list | None) -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (CI installs it: make test runs the Node tests)")
    done = subprocess.run(
        [node, "--input-type=module", "-e", NODE_FORMAT],
        input=json.dumps(pairs),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_thousands_of_generated_values_read_the_same_on_the_page():
    pairs = [
        [name, value]
        for value in _values()
        for name in ("length", "area", "overlap", "credits", "pixels")
    ]
    pairs += [["position", [value % 360 - 180, value % 180 - 90]] for value in _values()[:2000]]
    page = json.loads(_node_run(pairs))
    differ = [
        f"{name}({value!r}): server {FORMATTERS[name](value)!r}, page {text!r}"
        for (name, value), text in zip(pairs, page, strict=True)
        if FORMATTERS[name](value) != text
    ]
    assert len(pairs) > 20_000
    assert not differ, f"{len(differ)} of {len(pairs)} differ, e.g.\n" + "\n".join(differ[:10])
