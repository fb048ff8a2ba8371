"""The map in Chromium (software WebGL): the MapLibre map on vector tiles against the old
Leaflet SVG map, on the same seeded database, in one run.

    .venv/bin/python bench/map.py --db /tmp/map-2000.sqlite3 [--db /tmp/map-200000.sqlite3 …]
        [--before /tmp/before-i17c [--before-label leaflet]] [--visits 5] [--trace DIR]
        [--out bench-map.json]

Each `--db` is a migrated SQLite file seeded by `manage.py seed_demo --annotations N --seed 1`.
`--before` is a checkout of the commit before the WebGL map (`git worktree add
/tmp/before-i17c d6b80ee`): its Daphne serves the same file, so both maps read the same data.
For each database, both maps' servers are started and left to finish their start-up work
(the index built, as a serving process has it); then:
- first draw: navigation start → `window.geosenseMap.ready === true` (annotations drawn), on
  `--visits` first visits per map, each in a fresh browser context (logged in through the
  form's POST: nothing of the page cached), the maps taking turns visit by visit so that both
  meet the same machine load; the median, and with each visit what it cost in CPU, which
  depends much less on the load than its wall time: the page's main thread (CDP
  `Performance.getMetrics` ThreadTime), its renderer process (ProcessTime: main thread, tile
  workers, script parsing), every Chromium process of this bench (/proc: browser, GPU,
  renderer, network), and the server (/proc);
- then, per map in one more fresh context: a first visit and a reload (the browser's cache
  holding the code and the tiles, revalidated), with where the first visit's time went (HTML,
  tile JSON, first and last tile), and everything below in that context;
- `--trace DIR`: one more first visit per map under a Chromium trace (DIR/<n>-<map>.json),
  summarised as CPU per thread from navigation to the first draw;
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
`--before-label` names the `--before` map in the output (default "leaflet"; any other label when
`--before` is an older MapLibre commit).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sqlite3
import statistics
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


def chromium_cpu() -> dict[str, float]:
    """CPU seconds so far of this bench's Chromium processes (this process's descendants), by
    process type: browser, renderer, gpu-process, utility (network)."""
    children: dict[int, list[int]] = {}
    kinds: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        # Chromium's child processes rewrite their title: one string, arguments after spaces.
        if command.split(b"\0")[0].split(b" ")[0].endswith(b"/chromium"):
            kind = re.search(rb"--type=([a-z-]+)", command)
            kind = kind.group(1).decode() if kind else "browser"
            seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            kinds[int(entry)] = (kind, seconds)
    out: dict[str, float] = {}
    stack = [os.getpid()]
    while stack:
        for child in children.get(stack.pop(), []):
            stack.append(child)
            if child in kinds:
                kind, seconds = kinds[child]
                out[kind] = out.get(kind, 0.0) + seconds
    return out


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


TRACE_CATEGORIES = [
    "devtools.timeline",
    "v8",
    "disabled-by-default-devtools.timeline",
    "blink.user_timing",
]


def first_visit(browser, base: str, pid: int, trace: Path | None = None) -> dict:
    """One first visit in a fresh context (empty cache): navigation → first draw, and the CPU
    it cost (main thread, renderer, every Chromium process, the server)."""
    context = browser.new_context(bypass_csp=True, viewport={"width": 1280, "height": 800})
    try:
        log_in(context, base)
        page = context.new_page()
        page.add_init_script(PROBE)
        cdp = context.new_cdp_session(page)
        cdp.send("Performance.enable")
        load = load_average()
        chromium, server = chromium_cpu(), cpu_seconds(pid)
        if trace:
            browser.start_tracing(page=page, path=str(trace), categories=TRACE_CATEGORIES)
        page.goto(f"{base}/chat/")
        page.wait_for_function("window.__bench && window.__bench.ready !== null", timeout=300_000)
        ready = page.evaluate("window.__bench.ready")
        metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        server = cpu_seconds(pid) - server
        after = chromium_cpu()
        if trace:
            browser.stop_tracing()
        return {
            "first_draw_ms": ready,
            "main_thread_cpu_ms": metrics["ThreadTime"] * 1000,
            "renderer_cpu_ms": metrics["ProcessTime"] * 1000,
            "chromium_cpu_ms": {k: (v - chromium.get(k, 0.0)) * 1000 for k, v in after.items()},
            "server_cpu_ms": server * 1000,
            "load": load,
            **({"trace": trace_summary(trace, ready)} if trace else {}),
        }
    finally:
        context.close()


def trace_summary(path: Path, ready_ms: float) -> dict:
    """CPU (thread time) per thread name, navigation start → first draw, from a trace's
    top-level tasks; and the longest of them on the main thread."""
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"
    }
    origin = next(
        e["ts"]
        for e in events
        if e.get("name") == "navigationStart"
        and "/chat/" in e["args"].get("data", {}).get("documentLoaderURL", "")
    )
    end = origin + ready_ms * 1000
    cpu: dict[str, float] = {}
    longest = 0.0
    for e in events:
        if e.get("ph") != "X" or e.get("name") not in ("RunTask", "ThreadControllerImpl::RunTask"):
            continue
        if not origin <= e["ts"] <= end:
            continue
        thread = names.get((e["pid"], e["tid"]), "?")
        cpu[thread] = cpu.get(thread, 0.0) + e.get("tdur", 0) / 1000
        if thread == "CrRendererMain":
            longest = max(longest, e["dur"] / 1000)
    busiest = dict(sorted(cpu.items(), key=lambda kv: -kv[1])[:8])
    return {"cpu_ms_by_thread": busiest, "longest_main_task_ms": longest}


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


def measure_map(browser, base: str, bounds: list[float]) -> dict:
    """The tour, the server's own tile latency, the scripted move and the heap, in one fresh
    context that first visits and reloads the page."""
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
        "tour_first_draw_ms": first_draw,
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


def median_of(visits: list[dict], key: str) -> float:
    return statistics.median(visit[key] for visit in visits)


def measure_size(
    browser, db: Path, maps: list[tuple[str, Path]], visits: int, trace_dir: Path | None, tour: bool
) -> list[dict]:
    """Every map on one database: servers started side by side, first visits taking turns,
    then each map's tour."""
    count, bounds = data_bounds(db)
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        for name, checkout in maps:
            port = free_port()
            servers[name] = (
                start_daphne(checkout, db, port, db.with_suffix(f".{name}.log")),
                f"http://127.0.0.1:{port}",
            )
        warm = {
            name: warm_server(browser, base, server.pid) for name, (server, base) in servers.items()
        }
        firsts: dict[str, list[dict]] = {name: [] for name in servers}
        for _ in range(visits):
            for name, (server, base) in servers.items():
                firsts[name].append(first_visit(browser, base, server.pid))
        rows = []
        for name, (server, base) in servers.items():
            traced = {}
            if trace_dir:
                trace_dir.mkdir(parents=True, exist_ok=True)
                path = trace_dir / f"{count}-{name}.json"
                traced = {"traced_visit": first_visit(browser, base, server.pid, path)}
            load = load_average()
            rows.append(
                {
                    "annotations": count,
                    "map": name,
                    "server_warm_s": warm[name],
                    "first_draw_ms": median_of(firsts[name], "first_draw_ms"),
                    "main_thread_cpu_ms": median_of(firsts[name], "main_thread_cpu_ms"),
                    "renderer_cpu_ms": median_of(firsts[name], "renderer_cpu_ms"),
                    "chromium_cpu_ms": statistics.median(
                        sum(v["chromium_cpu_ms"].values()) for v in firsts[name]
                    ),
                    "server_cpu_ms": median_of(firsts[name], "server_cpu_ms"),
                    "first_visits": firsts[name],
                    **traced,
                    **(measure_map(browser, base, bounds) if tour else {}),
                    "load": [load, load_average()],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        return rows
    finally:
        for server, _ in servers.values():
            server.terminate()
            server.wait(timeout=30)


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
    parser.add_argument("--before-label", default="leaflet", help="the --before map's name")
    parser.add_argument("--visits", type=int, default=5, help="first visits per map (median)")
    parser.add_argument("--trace", type=Path, default=None, help="a directory for traces")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--no-tour", action="store_true", help="first visits only (no reload, tour, move, heap)"
    )
    parser.add_argument(
        "--chromium-arg", action="append", default=[], help="another Chromium flag (repeatable)"
    )
    args = parser.parse_args()
    maps = [("maplibre", ROOT)] + ([(args.before_label, args.before)] if args.before else [])
    results = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=[*CHROMIUM_ARGS, *args.chromium_arg]
        )
        for db in args.db:
            results += measure_size(browser, db, maps, args.visits, args.trace, not args.no_tour)
        browser.close()
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    for row in results:
        print_row(row)
    if len(maps) == 2:
        for count in sorted({row["annotations"] for row in results}):
            new, old = (
                next(r for r in results if r["annotations"] == count and r["map"] == m)
                for m in ("maplibre", args.before_label)
            )
            print(
                f"{count:>9,} {args.before_label}/maplibre: first draw"
                f" {old['first_draw_ms'] / new['first_draw_ms']:.2f}x,"
                f" main-thread CPU {old['main_thread_cpu_ms'] / new['main_thread_cpu_ms']:.2f}x,"
                f" renderer CPU {old['renderer_cpu_ms'] / new['renderer_cpu_ms']:.2f}x,"
                f" Chromium CPU {old['chromium_cpu_ms'] / new['chromium_cpu_ms']:.2f}x"
                + (
                    f", frame p99 {(old['frame_p99_ms'] or 0) / (new['frame_p99_ms'] or 1):.2f}x,"
                    f" heap {old['heap_mb'] / new['heap_mb']:.2f}x"
                    if "tour" in new
                    else ""
                )
            )


def tour_figures(tour: dict) -> str:
    """p50/p99 of a tour's tile requests, or that it asked none (all in MapLibre's memory)."""
    if not tour["tiles"]:
        return "none asked"
    return f"p50/p99 {tour['p50_ms']:5.1f}/{tour['p99_ms']:6.1f} ms ({tour['tiles']})"


def print_row(row: dict) -> None:
    draws = sorted(round(v["first_draw_ms"]) for v in row["first_visits"])
    load = f"load {min(v['load'] for v in row['first_visits']):.1f}-{max(row['load']):.1f}"
    first = (
        f"{row['annotations']:>9,} {row['map']:<9} first draw median {row['first_draw_ms']:6.0f} ms"
        f" of {draws}; CPU to first draw: main thread {row['main_thread_cpu_ms']:.0f} ms,"
        f" renderer {row['renderer_cpu_ms']:.0f} ms, all Chromium {row['chromium_cpu_ms']:.0f} ms,"
        f" server {row['server_cpu_ms']:.0f} ms"
    )
    if "tour" not in row:
        print(f"{first} | {load}")
        return
    cold, warm = row["tour"]["cold"], row["tour"]["warm"]
    print(
        f"{first}, reload {row['repeat_draw_ms']:.0f} ms"
        f" | tiles cold {tour_figures(cold)} warm {tour_figures(warm)}"
        f" largest {cold['largest_bytes'] or 0:>7} B"
        f" | server fresh p50/p99 {row['serial']['fresh']['p50_ms'] or 0:.1f}/"
        f"{row['serial']['fresh']['p99_ms'] or 0:.1f} ms,"
        f" 304 {row['serial']['revalidated']['p50_ms'] or 0:.1f}/"
        f"{row['serial']['revalidated']['p99_ms'] or 0:.1f} ms"
        f" | long tasks {row['long_tasks']} (max {row['longest_task_ms']:.0f} ms)"
        f" frames p50/p99 {row['frame_p50_ms'] or 0:.1f}/{row['frame_p99_ms'] or 0:.1f} ms"
        f" | heap {row['heap_mb']:.1f} MB | {load}"
    )


if __name__ == "__main__":
    main()
