"""Spatial queries on 200,000 seeded annotations, in one run:

    .venv/bin/python bench/spatial.py [--annotations 200000] [--runs 9] [--sample 400]

- within-distance, "trees within 20 m of a house": the service
  (`annotations_within_distance`, warm index) against a bare shapely
  `STRtree.query(trees, predicate="dwithin", distance=20)` on the same projected geometries
  (pairs only: no nearest target, no distances), the two timed in alternation, and against a brute-force
  loop (every tree against every house, `shapely.distance` vectorised over the houses) timed on
  a random sample of trees and scaled to all of them; the sample also checks that service and
  brute force agree.
- similarity top-20 (`annotations_similar` from the showcase pool), warm, against a brute-force
  Python loop computing the same standardised cosine over every pool.
Also: the seed itself and the first (cold) query, which builds the index.

The database is a temporary SQLite file. Each timing is the median of `--runs` repetitions,
as wall time and as this process's CPU time (the machine may be busy with other work).
"""

import argparse
import math
import statistics
import time
from collections.abc import Callable

from seeded import seeded_demo  # bench/ is on the path when a bench runs


def timed(fn: Callable[[], object], runs: int) -> tuple[float, float, object]:
    """Median wall and CPU seconds of fn over runs, and its last result."""
    walls, cpus, result = [], [], None
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


def timed_alternately(
    first: Callable[[], object], second: Callable[[], object], runs: int
) -> tuple[tuple[float, float, object], tuple[float, float, object]]:
    """`timed` for two functions run turn about, so that neither profits from a quieter moment."""
    a: list[tuple[float, float, object]] = []
    b: list[tuple[float, float, object]] = []
    for _ in range(runs):
        a.append(timed(first, 1))
        b.append(timed(second, 1))
    return tuple(  # type: ignore[return-value]
        (statistics.median(t[0] for t in r), statistics.median(t[1] for t in r), r[-1][2])
        for r in (a, b)
    )


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--annotations", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument(
        "--sample", type=int, default=400, help="trees timed in the brute-force loop"
    )
    args = parser.parse_args()

    created, seed_s = seeded_demo(args.annotations)
    import numpy as np
    import shapely

    from geosense.annotations import selectors
    from geosense.annotations.index import spatial_index
    from geosense.annotations.models import Annotation

    counts = selectors.annotation_counts()
    print(f"seeded {created:,} annotations in {seed_s:.1f} s: {counts}")

    def service():
        return selectors.annotations_within_distance(source="tree", target="house", distance_m=20)

    started = time.perf_counter()
    service()
    cold_s = time.perf_counter() - started
    index = spatial_index()
    trees, houses = index.classes["tree"], index.classes["house"]

    def bare():
        return houses.tree.query(trees.geoms, predicate="dwithin", distance=20)

    (service_wall, service_cpu, pairs), (bare_wall, bare_cpu, bare_pairs) = timed_alternately(
        service, bare, args.runs
    )

    rng = np.random.default_rng(0)
    sample = rng.choice(len(trees.ids), size=min(args.sample, len(trees.ids)), replace=False)

    def brute():
        found = {}
        for pos in sample:
            metres = shapely.distance(trees.geoms[pos], houses.geoms)
            best = int(np.argmin(metres))
            if metres[best] <= 20:
                found[int(trees.ids[pos])] = (int(houses.ids[best]), float(metres[best]))
        return found

    brute_wall, brute_cpu, brute_found = timed(brute, max(1, args.runs // 3))
    scale = len(trees.ids) / len(sample)
    by_source = {p.source_id: p for p in pairs}
    sampled_ids = {int(trees.ids[pos]) for pos in sample}
    agree = all(
        (tree_id in by_source) == (tree_id in brute_found)
        and (
            tree_id not in brute_found
            or math.isclose(
                by_source[tree_id].distance_m, brute_found[tree_id][1], rel_tol=0.005, abs_tol=0.01
            )
        )
        for tree_id in sampled_ids
    )

    pool = Annotation.objects.filter(category="pool").order_by("id").values_list("id", flat=True)[0]

    def similar() -> list:
        return selectors.annotations_similar(samples=[(pool, None)], k=20)

    started = time.perf_counter()
    similar()
    similar_cold_s = time.perf_counter() - started
    similar_wall, similar_cpu, hits = timed(similar, args.runs)
    pool_vectors = list(Annotation.objects.filter(category="pool").values_list("id", "vectors"))

    def similar_brute() -> list:
        rows = [(pk, v["shape"]) for pk, v in pool_vectors]
        size = len(rows[0][1])
        mean = [sum(r[1][i] for r in rows) / len(rows) for i in range(size)]
        std = [
            math.sqrt(sum((r[1][i] - mean[i]) ** 2 for r in rows) / len(rows)) or 1.0
            for i in range(size)
        ]

        def unit(v):
            z = [(v[i] - mean[i]) / std[i] for i in range(size)]
            norm = math.sqrt(sum(x * x for x in z)) or 1.0
            return [x / norm for x in z]

        target = unit(dict(rows)[pool])
        scored = [
            (-sum(a * b for a, b in zip(unit(v), target, strict=True)), pk)
            for pk, v in rows
            if pk != pool
        ]
        return [pk for _, pk in sorted(scored)[:20]]

    brute_sim_wall, brute_sim_cpu, brute_top = timed(similar_brute, max(1, args.runs // 3))
    same_top = [h.id for h in hits] == brute_top

    print()
    print(
        f"trees within 20 m of a house: {len(pairs):,} trees paired "
        f"({bare_pairs.shape[1]:,} tree-house pairs within 20 m); {len(trees.ids):,} trees, "
        f"{len(houses.ids):,} houses"
    )
    print("| query | median wall | median CPU | vs bare STRtree (wall / CPU) |")
    print("|---|---|---|---|")
    print(
        f"| service `annotations_within_distance` (warm) | {ms(service_wall)} | {ms(service_cpu)} | "
        f"{service_wall / bare_wall:.2f}× / {service_cpu / bare_cpu:.2f}× |"
    )
    print(
        f"| bare `STRtree.query(..., predicate='dwithin')` | {ms(bare_wall)} | {ms(bare_cpu)} | 1× |"
    )
    print(
        f"| brute-force loop ({len(sample)} trees, scaled ×{scale:,.0f}) | {ms(brute_wall * scale)} | "
        f"{ms(brute_cpu * scale)} | {brute_wall * scale / bare_wall:,.0f}× |"
    )
    print(f"| first query after a write (index build + query) | {ms(cold_s)} | | |")
    print(f"service agrees with brute force on the sample: {agree}")
    print()
    print("| similarity top-20 | median wall | median CPU |")
    print("|---|---|---|")
    print(f"| service `annotations_similar` (warm) | {ms(similar_wall)} | {ms(similar_cpu)} |")
    print(f"| service, first call (loads the class's vectors) | {ms(similar_cold_s)} | |")
    print(
        f"| brute-force Python loop over {len(pool_vectors):,} pools | {ms(brute_sim_wall)} | {ms(brute_sim_cpu)} |"
    )
    print(f"same top 20 as brute force: {same_top}")
    print(f"\nseed of {created:,} annotations: {seed_s:.1f} s")


if __name__ == "__main__":
    main()
