"""Spatial questions in PostGIS against the in-process index, on the same PostgreSQL database:

    .venv/bin/python bench/postgis.py [--sizes 200000,1000000] [--runs 3] [--writes N]
                                      [--url SIZE=postgres://…] …

For each size, one database holds the demo (`seed_demo --annotations SIZE --seed 0`): a
throwaway PostgreSQL + PostGIS cluster (tests/scale/cluster.py), migrated and seeded here (a
million rows take minutes), or an existing database given by `--url SIZE=URL` (already
seeded). A worker process per size (Django reads DATABASE_URL once) times, in alternation:

- "trees within 20 m of a house" (`annotations_within_distance`): through PostGIS
  (`GEOSENSE_SPATIAL_BACKEND=auto` on PostgreSQL) and through the warm index ("index");
- overlap (solar panels on houses), nearest (5 nearest to the demo's centre) and similarity
  (top 20 pools like the first) the same way;
- the index's first build (what the first question after a start or a write costs there).

With `--writes N`, it then times the trigger that keeps `annotations_nearest` (migration
annotations/0007) on single writes next to N annotations picked at random: an insert of a tree
and of a house, a soft and a hard delete, a move and a class change, each in a transaction
rolled back (the database is left as it was).

Each figure is the median of `--runs`: wall time, this process's CPU time ("app CPU": fetching
and reading the rows) and PostgreSQL's CPU time (every backend and parallel worker of the
cluster, from /proc: the server runs here, and nothing else should use it meanwhile). Answers are compared (same
pairs, metres within 0.1 %). The load average is printed with the figures.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from proc_cpu import postgres_cpu  # noqa: E402 - bench/ is on the path


def postmaster_of(backend_pid: int) -> int:
    """The postmaster: the parent of the backend serving this process's connection."""
    return int(Path(f"/proc/{backend_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def timed(fn: Callable[[], Any], postmaster: int) -> tuple[dict[str, float], Any]:
    """Wall, this process's CPU and PostgreSQL's CPU (every backend and parallel worker) of fn."""
    wall, cpu, server = time.perf_counter(), time.process_time(), postgres_cpu(postmaster)
    result = fn()
    return {
        "wall": time.perf_counter() - wall,
        "cpu": time.process_time() - cpu,
        "db_cpu": postgres_cpu(postmaster) - server,
    }, result


def medians(samples: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


def worker(runs: int) -> None:
    """In a process of its own, DATABASE_URL set: time each question through both engines."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "geosense.settings")
    django.setup()
    from django.db import connection
    from django.test import override_settings

    from geosense.annotations import demo, selectors
    from geosense.annotations.index import spatial_index
    from geosense.annotations.spatial import spatial_backend

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    pid = postmaster_of(pid)
    pool = selectors.annotation_list(category="pool", limit=1)[0].id
    questions: dict[str, Callable[[], Any]] = {
        "within": lambda: selectors.annotations_within_distance(
            source="tree", target="house", distance_m=20
        ),
        "overlap": lambda: selectors.annotations_overlapping(source="solar_panel", target="house"),
        "nearest": lambda: selectors.annotations_nearest(
            lat=demo.PLACE_LAT, lon=demo.PLACE_LON, k=5
        ),
        "similar": lambda: selectors.annotations_similar(samples=[(pool, None)], k=20),
    }
    with override_settings(GEOSENSE_SPATIAL_BACKEND="index"):
        build, index = timed(spatial_index, pid)
    out: dict[str, Any] = {"build": build, "count": sum(index.counts().values())}
    for name, question in questions.items():
        samples: dict[str, list[dict[str, float]]] = {"postgis": [], "index": []}
        answers: dict[str, Any] = {}
        for _ in range(runs):
            for engine in ("postgis", "index"):
                with override_settings(
                    GEOSENSE_SPATIAL_BACKEND="auto" if engine == "postgis" else engine
                ):
                    assert spatial_backend() == engine
                    sample, answers[engine] = timed(question, pid)
                samples[engine].append(sample)
        out[name] = {engine: medians(s) for engine, s in samples.items()}
        out[name]["agree"], out[name]["size"] = _agree(name, answers["postgis"], answers["index"])
    print(json.dumps(out))


def _within_map(pairs: Any) -> dict[int, tuple[int, float]]:
    links = zip(pairs.target_ids.tolist(), pairs.distances_m.tolist(), strict=True)
    return dict(zip(pairs.source_ids.tolist(), links, strict=True))


def _agree(name: str, ours: Any, theirs: Any) -> tuple[str, int]:
    """Whether the engines gave the same answer: ids and links equal, values within 0.1 %.
    A link that differs with its value within 0.1 % is a near-tie (two targets at the same
    distance to 1e-8: each engine's rounding picks one), counted apart."""
    if name == "within":
        a, b = _within_map(ours), _within_map(theirs)
    elif name == "overlap":
        a = {p.source_id: (p.target_id, p.share) for p in ours}
        b = {p.source_id: (p.target_id, p.share) for p in theirs}
    elif name == "similar":
        a = {h.id: (h.category, h.score) for h in ours}
        b = {h.id: (h.category, h.score) for h in theirs}
    else:
        a = {h.id: (h.category, h.distance_m) for h in ours}
        b = {h.id: (h.category, h.distance_m) for h in theirs}
    if a.keys() != b.keys():
        return "no: other ids", len(a)
    close = [abs(a[i][1] - b[i][1]) <= 0.001 * max(abs(b[i][1]), 1e-9) for i in a]
    if not all(close):
        return f"no: {close.count(False)} values apart", len(a)
    ties = sum(a[i][0] != b[i][0] for i in a)
    return ("yes" if not ties else f"yes but {ties} near-tie link(s)"), len(a)


WRITES = {
    "insert a tree 3 m from an annotation": (
        "INSERT INTO annotations_annotation (category, geometry, min_lon, min_lat, max_lon,"
        " max_lat, area_m2, length_m, attributes, vectors, source, created, updated) VALUES"
        " ('tree', jsonb_build_object('type', 'Point', 'coordinates',"
        " jsonb_build_array(%(x)s + 0.00003, %(y)s)), 0, 0, 0, 0, 0, 0, '{}', '{}', 'bench',"
        " now(), now())"
    ),
    "insert a 10 m house there": (
        "INSERT INTO annotations_annotation (category, geometry, min_lon, min_lat, max_lon,"
        " max_lat, area_m2, length_m, attributes, vectors, source, created, updated) VALUES"
        " ('house', ST_AsGeoJSON(ST_MakeEnvelope(%(x)s, %(y)s, %(x)s + 0.0001, %(y)s + 0.0001,"
        " 4326))::jsonb, 0, 0, 0, 0, 0, 0, '{}', '{}', 'bench', now(), now())"
    ),
    "soft delete": "UPDATE annotations_annotation SET deleted_at = now() WHERE id = %(id)s",
    "hard delete": "DELETE FROM annotations_annotation WHERE id = %(id)s",
    "move (geometry updated)": (
        "UPDATE annotations_annotation SET geometry = jsonb_build_object('type', 'Point',"
        " 'coordinates', jsonb_build_array(%(x)s + 0.0001, %(y)s + 0.0001)) WHERE id = %(id)s"
    ),
    "class change": "UPDATE annotations_annotation SET category = 'shed' WHERE id = %(id)s",
}


def write_costs(url: str, n: int) -> None:
    """Print the kept table's trigger time on single writes next to n random annotations."""
    import psycopg

    with psycopg.connect(url) as conn:
        picks = conn.execute(
            "SELECT id, ST_X(ST_PointOnSurface(geom)), ST_Y(ST_PointOnSurface(geom))"
            " FROM annotations_annotation WHERE deleted_at IS NULL ORDER BY hashint8(id)"
            " LIMIT %s",
            [n],
        ).fetchall()
        conn.rollback()
        times: dict[str, list[float]] = {name: [] for name in WRITES}
        for pk, x, y in picks:
            for name, sql in WRITES.items():
                plan = conn.execute(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", {"id": pk, "x": x, "y": y}
                ).fetchone()[0]
                conn.rollback()
                for trigger in plan[0].get("Triggers", []):
                    if trigger["Trigger Name"] == "annotations_nearest_sync":
                        times[name].append(trigger["Time"])
    print(f"\nThe kept table's trigger on single writes ({n} places):")
    print("| write | median | max |\n|---|---|---|")
    for name, found in times.items():
        print(f"| {name} | {statistics.median(found):.1f} ms | {max(found):.1f} ms |")


def seeded_database(size: int, workdir: Path) -> tuple[str, Any]:
    """A throwaway cluster with the demo of `size` annotations: (its URL, the cluster)."""
    from tests.browser.daphne_server import manage, server_env
    from tests.scale.cluster import PostgresCluster, postgres_bindir

    postgres = PostgresCluster(bindir=postgres_bindir()).start()
    env = server_env(database_url=postgres.url)
    manage("migrate", "--noinput", env=env)
    started = time.perf_counter()
    # Not through `manage`, whose 5-minute limit suits a test: a million rows took 5 min 49 s
    # at load 10 (and 7 min 45 s at load 11).
    subprocess.run(
        [sys.executable, "manage.py", "seed_demo", "--annotations", str(size), "--seed", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    print(f"seeded {size:,} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    postgres.sql("VACUUM ANALYZE annotations_annotation")
    return postgres.url, postgres


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def report(size: int, out: dict[str, Any]) -> None:
    load = os.getloadavg()
    print(
        f"\n### {size:,} annotations ({out['count']:,} live); load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
    )
    print(
        f"index build (first question after a start or a write): wall {ms(out['build']['wall'])}, CPU {ms(out['build']['cpu'])}"
    )
    print(
        "| question | answer size | PostGIS wall | PostGIS server CPU | PostGIS app CPU | index (warm) wall | index CPU | wall ratio PostGIS/index | same answer |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in ("within", "overlap", "nearest", "similar"):
        row, pg, ix = out[name], out[name]["postgis"], out[name]["index"]
        print(
            f"| {name} | {row['size']:,} | {ms(pg['wall'])} | {ms(pg['db_cpu'])} | {ms(pg['cpu'])} | {ms(ix['wall'])} | "
            f"{ms(ix['cpu'])} | {pg['wall'] / ix['wall']:.1f}x | {row['agree']} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="200000,1000000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--url", action="append", default=[], help="SIZE=URL of a seeded database")
    parser.add_argument("--writes", type=int, default=0, help="time the trigger on N writes")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.runs)
        return
    given = dict(item.split("=", 1) for item in args.url)
    print(f"bench/postgis.py --sizes {args.sizes} --runs {args.runs}")
    for size in (int(s) for s in args.sizes.split(",")):
        cluster = None
        url = given.get(str(size))
        if url is None:
            url, cluster = seeded_database(size, Path(tempfile.mkdtemp()))
        try:
            env = {
                **os.environ,
                "DATABASE_URL": url,
                "DEBUG": "1",
                "SECRET_KEY": "bench",
                "GEOSENSE_ENV_FILE": "",
                "GEOSENSE_INDEX_WARM": "0",
            }
            done = subprocess.run(
                [sys.executable, __file__, "--worker", "--runs", str(args.runs)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
            )
            report(size, json.loads(done.stdout.strip().splitlines()[-1]))
            if args.writes:
                write_costs(url, args.writes)
        finally:
            if cluster is not None:
                cluster.stop()


if __name__ == "__main__":
    main()
