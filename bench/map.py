"""The map in Chromium (software WebGL): the MapLibre map on vector tiles against the old
Leaflet SVG map, on the same seeded database, in one run.

    .venv/bin/python bench/map.py --db /tmp/map-2000.sqlite3 [--db /tmp/map-200000.sqlite3 …]
        [--before /tmp/before-i17c] [--out bench-map.json]

Each `--db` is a migrated SQLite file seeded by `manage.py seed_demo --annotations N --seed 1`.
`--before` is a checkout of the commit before the WebGL map (`git worktree add
/tmp/before-i17c d6b80ee`): its Daphne serves the same file, so both maps read the same data.
For each database and each map (after, then before), on a server that has answered one
request (its index built, as a serving process has it), in a fresh browser context:
- first draw: navigation start → `window.geosenseMap.ready === true` (annotations drawn), on
  the first visit (logged in through the form's POST: nothing of the page cached) and on a
  reload, with where the first visit's time went (HTML, tile JSON, first and last tile);
- tile latency: every `/tiles/annotations/…` request (as Playwright's network events see it:
  request start → response end; MapLibre fetches in its workers) over a tour of web zooms 12 to 19, three places per zoom, each visit waiting for the map
  to settle; the tour runs twice: cold (empty HTTP cache) and warm (ETag revalidations, 304);
- during a scripted pan and zoom (8 pans of 200 px, zoom in and out 3 levels, animated):
  main-thread long tasks (PerformanceObserver 'longtask') and frame intervals (rAF);
- the same tiles again one at a time from the test process, fresh then with If-None-Match
  (the server's latency without the browser's parallel requests);
- the main thread's JS heap after the tour (CDP Runtime.getHeapUsage) and the largest tile
  (encoded body bytes).
The old map has no tiles: its "tiles" line stays empty, and its tour moves its one SVG layer.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    # Software WebGL in the GPU process, as a machine without a GPU runs it. (The browser tests
    # pass --disable-gpu, which runs SwiftShader on the page's main thread: correct pictures,
    # but every frame's rasterisation would count as the page's long task.)
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOUR_ZOOMS = range(12, 20)
PLACES = ((0.5, 0.5), (0.3, 0.35), (0.7, 0.65))

# Installed before any page script: records when the map is ready, long tasks and frames.
PROBE = """
(() => {
  window.__bench = { ready: null, longtasks: [], frames: [], recording: false };
  const poll = setInterval(() => {
    if (window.geosenseMap && window.geosenseMap.ready === true) {
      window.__bench.ready = performance.now();
      clearInterval(poll);
    }
  }, 5);
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      if (window.__bench.recording) window.__bench.longtasks.push(entry.duration);
    }
  }).observe({ type: 'longtask', buffered: false });
  let last = null;
  const frame = (now) => {
    if (window.__bench.recording && last !== null) window.__bench.frames.push(now - last);
    last = now;
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
})();
"""

# Moves either map to web zoom `z` at a fraction (fx, fy) of the data's bounds, then waits.
GO = """async ([z, fx, fy, bounds]) => {
  const m = window.geosenseMap;
  const [w, s, e, n] = bounds;
  const lon = w + (e - w) * fx, lat = s + (n - s) * fy;
  if (m.idle) {
    m.map.jumpTo({ center: [lon, lat], zoom: z - 1 });
    await m.idle();
  } else {
    m.map.setView([lat, lon], z, { animate: false });
    await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  }
}"""

# A scripted pan and zoom, animated, the same for both maps.
MOVE = """async () => {
  const m = window.geosenseMap, map = m.map, gl = Boolean(m.idle);
  const settle = () => gl ? m.idle() : new Promise((r) => setTimeout(r, 300));
  window.__bench.recording = true;
  for (let i = 0; i < 8; i += 1) {
    const dx = i % 2 ? -200 : 200, dy = i % 4 < 2 ? 120 : -120;
    if (gl) map.panBy([dx, dy], { duration: 400 }); else map.panBy([dx, dy], { duration: 0.4 });
    await new Promise((r) => setTimeout(r, 450));
    await settle();
  }
  for (const step of [1, 1, 1, -1, -1, -1]) {
    if (gl) map.zoomTo(map.getZoom() + step, { duration: 400 }); else map.setZoom(map.getZoom() + step);
    await new Promise((r) => setTimeout(r, 450));
    await settle();
  }
  window.__bench.recording = false;
  return { longtasks: window.__bench.longtasks, frames: window.__bench.frames };
}"""


class TileRequests:
    """The tile requests of a context, as Playwright sees them (MapLibre fetches tiles in its
    workers, whose requests the page's Resource Timing does not list): [ms, bytes, status]."""

    def __init__(self, context) -> None:
        self.entries: list[list[float]] = []
        self.spans: list[tuple[float, float]] = []  # epoch ms: request start, response end
        self.urls: set[str] = set()
        context.on("requestfinished", self._finished)

    def _finished(self, request) -> None:
        if "/tiles/annotations/" not in request.url:
            return
        timing = request.timing
        response = request.response()
        size = int(response.headers.get("content-length", 0)) if response else 0
        if response and not size and response.status == 200:
            size = request.sizes()["responseBodySize"]
        self.entries.append([timing["responseEnd"], size, response.status if response else 0])
        self.spans.append((timing["startTime"], timing["startTime"] + timing["responseEnd"]))
        self.urls.add(request.url)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daphne(checkout: Path, db: Path, port: int, log: Path) -> subprocess.Popen:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GEOSENSE_")},
        "DJANGO_SETTINGS_MODULE": "geosense.settings",
        "DEBUG": "1",
        "SECRET_KEY": "bench-map",
        "DATABASE_URL": f"sqlite:///{db}",
        "GEOSENSE_ENV_FILE": "",
        "PYTHONPATH": str(checkout),
    }
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(
        [*command, "geosense.asgi:application"],
        cwd=checkout,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    for _ in range(600):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"Daphne did not start: {log.read_text()[-2000:]}")


def percentile(samples: list[float], fraction: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def tile_figures(entries: list[list[float]]) -> dict:
    times = [entry[0] for entry in entries]
    return {
        "tiles": len(entries),
        "p50_ms": percentile(times, 0.5),
        "p99_ms": percentile(times, 0.99),
        "largest_bytes": max((entry[1] for entry in entries), default=None),
    }


def log_in(context, base: str) -> None:
    """The demo user's session cookie in `context`, through the login form's POST (not the
    page: its redirect would open the chat page, loading the map's code and tiles before the
    measured first visit)."""
    context.request.get(f"{base}/accounts/login/")
    token = next(c["value"] for c in context.cookies() if c["name"] == "csrftoken")
    response = context.request.post(
        f"{base}/accounts/login/",
        form={"username": "demo", "password": "demo", "csrfmiddlewaretoken": token},
        headers={"Referer": f"{base}/accounts/login/"},
        max_redirects=0,
    )
    if response.status != 302:
        raise RuntimeError(f"login failed: HTTP {response.status}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_idle(pid: int, *, quiet: float = 0.05, timeout: float = 600) -> float:
    """Waits until the server spends under `quiet` of a core for two seconds in a row (its
    start-up work done: the index, the tiles' shapes, the initial tiles); returns the wait."""
    started = time.perf_counter()
    calm = 0
    last = cpu_seconds(pid)
    while calm < 2 and time.perf_counter() - started < timeout:
        time.sleep(1)
        now = cpu_seconds(pid)
        calm = calm + 1 if now - last < quiet else 0
        last = now
    return time.perf_counter() - started


def serial_tiles(page, urls: list[str]) -> dict:
    """The tour's tiles again, one request at a time from the test process (no browser, no
    parallel requests): the server's own latency, fresh (200) then revalidated (304)."""
    out = {}
    tags = {}
    for name in ("fresh", "revalidated"):
        times = []
        for url in urls:
            headers = {"If-None-Match": tags[url]} if name == "revalidated" else {}
            started = time.perf_counter()
            response = page.request.get(url, headers=headers)
            times.append((time.perf_counter() - started) * 1000)
            tags[url] = response.headers.get("etag", "")
        out[name] = {
            "n": len(times),
            "p50_ms": percentile(times, 0.5),
            "p99_ms": percentile(times, 0.99),
        }
    return out


def warm_server(browser, base: str, pid: int) -> float:
    """One logged-in read of the tile JSON, then the server left to finish its start-up work
    (GEOSENSE_INDEX_WARM: the index, the tiles' shapes and the tiles of the data's extent), as
    a serving process behind a readiness check has it; no map is opened. Returns the wait."""
    started = time.perf_counter()
    context = browser.new_context()
    log_in(context, base)
    context.request.get(f"{base}/tiles/annotations.json", timeout=600_000)
    context.request.get(f"{base}/api/annotations?bbox=0,0,0.001,0.001", timeout=600_000)
    context.close()
    wait_idle(pid)
    return time.perf_counter() - started


def first_draws(page, base: str, tiles: TileRequests) -> tuple[float, float, dict]:
    """Navigation → the map's `ready` on the first visit (empty browser cache) and on a
    reload (the browser's cache holding the code and the tiles, revalidated), and where the
    first visit's time went."""
    draws = []
    for _ in range(2):
        page.goto(f"{base}/chat/")
        page.wait_for_function("window.__bench && window.__bench.ready !== null", timeout=300_000)
        draws.append(page.evaluate("window.__bench.ready"))
        if len(draws) == 1:
            timeline = page.evaluate(TIMELINE)
            timeline.update(tile_timeline(list(tiles.spans), timeline.pop("origin")))
    return draws[0], draws[1], timeline


# Where the first visit's time went: milliseconds from navigation start.
TIMELINE = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const ends = (part) => performance.getEntriesByType('resource')
    .filter((r) => r.name.includes(part)).map((r) => Math.round(r.responseEnd));
  return { origin: performance.timeOrigin, html_ms: Math.round(nav.responseEnd),
           dom_ms: Math.round(nav.domContentLoadedEventEnd),
           maplibre_ms: ends('maplibre-gl.mjs')[0] ?? null, json_ms: ends('annotations.json')[0] ?? null };
}"""


def tile_timeline(spans: list[tuple[float, float]], origin: float) -> dict:
    if not spans:
        return {}
    return {
        "first_tile_start_ms": round(min(s for s, _ in spans) - origin),
        "last_tile_end_ms": round(max(e for _, e in spans) - origin),
        "initial_tiles": len(spans),
    }


def measure_map(browser, base: str, bounds: list[float], pid: int) -> dict:
    warm_s = warm_server(browser, base, pid)
    context = browser.new_context(bypass_csp=True, viewport={"width": 1280, "height": 800})
    tiles = TileRequests(context)
    log_in(context, base)
    page = context.new_page()
    page.add_init_script(PROBE)
    first_draw, repeat_draw, timeline = first_draws(page, base, tiles)
    tours = {}
    for name in ("cold", "warm"):
        tiles.entries.clear()
        started = time.perf_counter()
        for zoom in TOUR_ZOOMS:
            for fx, fy in PLACES:
                page.evaluate(GO, [zoom, fx, fy, bounds])
        tours[name] = {
            **tile_figures(tiles.entries),
            "not_modified": sum(1 for entry in tiles.entries if entry[2] == 304),
            "tour_s": time.perf_counter() - started,
        }
    serial = serial_tiles(page, sorted(tiles.urls))
    page.evaluate(GO, [16, 0.5, 0.5, bounds])
    moved = page.evaluate(MOVE)
    cdp = context.new_cdp_session(page)
    cdp.send("HeapProfiler.collectGarbage")
    heap = cdp.send("Runtime.getHeapUsage")["usedSize"]
    context.close()
    frames = moved["frames"]
    return {
        "server_warm_s": warm_s,
        "first_draw_ms": first_draw,
        "repeat_draw_ms": repeat_draw,
        "first_visit": timeline,
        "tour": tours,
        "serial": serial,
        "long_tasks": len(moved["longtasks"]),
        "longest_task_ms": max(moved["longtasks"], default=0),
        "frame_p50_ms": percentile(frames, 0.5),
        "frame_p99_ms": percentile(frames, 0.99),
        "frames": len(frames),
        "heap_mb": heap / 2**20,
    }


def data_bounds(db: Path) -> tuple[int, list[float]]:
    with sqlite3.connect(db) as connection:
        row = connection.execute(
            "SELECT COUNT(*), MIN(min_lon), MIN(min_lat), MAX(max_lon), MAX(max_lat)"
            " FROM annotations_annotation WHERE deleted_at IS NULL"
        ).fetchone()
    return row[0], list(row[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, action="append", required=True)
    parser.add_argument("--before", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--chromium-arg", action="append", default=[], help="another Chromium flag (repeatable)"
    )
    args = parser.parse_args()
    maps = [("maplibre", ROOT)] + ([("leaflet", args.before)] if args.before else [])
    results = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=[*CHROMIUM_ARGS, *args.chromium_arg]
        )
        for db in args.db:
            count, bounds = data_bounds(db)
            for name, checkout in maps:
                port = free_port()
                log = db.with_suffix(f".{name}.log")
                server = start_daphne(checkout, db, port, log)
                try:
                    figures = measure_map(browser, f"http://127.0.0.1:{port}", bounds, server.pid)
                finally:
                    server.terminate()
                    server.wait(timeout=30)
                results.append({"annotations": count, "map": name, **figures})
                print(json.dumps(results[-1]), flush=True)
        browser.close()
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    for row in results:
        cold, warm = row["tour"]["cold"], row["tour"]["warm"]
        print(
            f"{row['annotations']:>9,} {row['map']:<9} first draw {row['first_draw_ms']:7.0f} ms"
            f" (again {row['repeat_draw_ms']:.0f} ms)"
            f" | tiles cold p50/p99 {cold['p50_ms'] or 0:5.1f}/{cold['p99_ms'] or 0:6.1f} ms"
            f" warm {warm['p50_ms'] or 0:5.1f}/{warm['p99_ms'] or 0:6.1f} ms"
            f" largest {cold['largest_bytes'] or 0:>7} B"
            f" | server fresh p50/p99 {row['serial']['fresh']['p50_ms'] or 0:.1f}/"
            f"{row['serial']['fresh']['p99_ms'] or 0:.1f} ms,"
            f" 304 {row['serial']['revalidated']['p50_ms'] or 0:.1f}/"
            f"{row['serial']['revalidated']['p99_ms'] or 0:.1f} ms"
            f" | long tasks {row['long_tasks']} (max {row['longest_task_ms']:.0f} ms)"
            f" frames p50/p99 {row['frame_p50_ms'] or 0:.1f}/{row['frame_p99_ms'] or 0:.1f} ms"
            f" | heap {row['heap_mb']:.1f} MB"
        )
    if len(maps) == 2:
        for count in sorted({row["annotations"] for row in results}):
            new, old = (
                next(r for r in results if r["annotations"] == count and r["map"] == m)
                for m in ("maplibre", "leaflet")
            )
            print(
                f"{count:>9,} first draw leaflet/maplibre"
                f" {old['first_draw_ms'] / new['first_draw_ms']:.2f}x,"
                f" frame p99 {(old['frame_p99_ms'] or 0) / (new['frame_p99_ms'] or 1):.2f}x,"
                f" heap {old['heap_mb'] / new['heap_mb']:.2f}x"
            )


if __name__ == "__main__":
    main()
