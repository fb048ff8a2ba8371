"""Parse + render of a heavy assistant message: a 10,000-id highlight through interpolation,
200 inline elements and 2 KB of Markdown (headings, a table, lists, code, links).
Run by hand: `.venv/bin/python bench/markup.py`.

Prints the median, p90 and max of the wall time per message over the runs, and the median
CPU time of this process (the work itself, without waiting for a CPU on a busy machine).
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "geosense.settings")
os.environ.setdefault("DEBUG", "1")  # a bench needs no production SECRET_KEY
os.environ["GEOSENSE_ENV_FILE"] = ""  # measured on the defaults, not on a local .env

import django

django.setup()

from chat.markup import render_message  # noqa: E402

IDS = 10_000
INLINE = 200
RUNS = 200


def artifacts_make() -> dict[str, object]:
    rng = random.Random(7)
    ids = rng.sample(range(1, 1_000_000), IDS)
    return {
        "artifact-1234-abcd": {
            "ids": ids,
            "links": [rng.randrange(1, 1_000_000) for _ in ids],
            "linkValues": [round(rng.uniform(0, 500), 2) for _ in ids],
            "linkType": "distance",
            "areas": [round(rng.uniform(5, 50_000), 1) for _ in ids],
            "attributeHints": {"areas": "area"},
        }
    }


def message_make() -> str:
    kinds = [
        'the closest building (<ref id="${artifact-1234-abcd.ids.%d}" />)',
        'is <size value="${artifact-1234-abcd.linkValues.%d}" /> away',
        'with an area of <area id="${artifact-1234-abcd.areas.%d}" />',
        'within <distance value="%d" /> of a house',
        'and <id v="vec-1">%d</id> looks <b>alike</b>',
    ]
    sentences = [kinds[n % len(kinds)] % n for n in range(INLINE)]
    return (
        'Here is what I found.\n<tool type="highlight" data="${artifact-1234-abcd}">'
        "Show the buildings</tool>\n" + ", ".join(sentences) + ".\n\n" + MARKDOWN
    )


# About 2 KB of the Markdown a model writes: headings, emphasis, a table, lists, code, links.
MARKDOWN = (
    """## Buildings near the largest trees

The **five largest trees** stand within *20 m* of a house; two of them overlap a ~~garage~~ shed.

| tree | house | distance | note |
|---:|:---|---:|---|
| <ref id="102" /> | <ref id="23" /> | <distance value="4.3" /> | **closest** |
| <ref id="103" /> | <ref id="23" /> | <distance value="5.6" /> | shares a fence |
| <ref id="104" /> | <ref id="51" /> | <distance value="5.8" /> | |
| <ref id="201" /> | <ref id="51" /> | <distance value="11.2" /> | overhangs the roof |

1. Check the trees closest to a house first.
2. Then the ones that overlap a shed:
   - <ref id="542" /> covers <area value="18.5" /> of it,
   - the others less than `5 %`.

> Distances are geodesic, measured between the outlines.

```json
{"ids": [102, 103, 104, 201, 542], "linkType": "distance"}
```

See [the survey](https://example.org/survey) for the method, and ask me to
**highlight** any of them on the map.
"""
    * 2
)


def main() -> None:
    artifacts, text = artifacts_make(), message_make()
    html = render_message(text, role="assistant", artifacts=artifacts)
    assert "markup-error" not in html and html.count("data-highlight=") == 1, html[:2000]
    print(f"message: {len(text):,} characters, of which {len(MARKDOWN):,} of Markdown")
    times, cpu = [], []
    for _ in range(RUNS):
        start, start_cpu = time.perf_counter(), time.process_time()
        render_message(text, role="assistant", artifacts=artifacts)
        times.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    times.sort()
    print(
        f"markup parse+render, {IDS:,}-id highlight via ${{…}}, {INLINE} inline elements, "
        f"{len(MARKDOWN) / 1000:.1f} KB of Markdown, "
        f"{RUNS} runs: median {statistics.median(times):.2f} ms, "
        f"p90 {times[int(RUNS * 0.9)]:.2f} ms, max {times[-1]:.2f} ms, "
        f"CPU median {statistics.median(cpu):.2f} ms, "
        f"{len(html):,} bytes of HTML"
    )


if __name__ == "__main__":
    main()
