"""`nearest_within` against the plan it replaced, on several class pairs of the demo data:

    .venv/bin/python bench/spatial_plans.py [--annotations 200000] [--runs 7]

The replaced plan: `STRtree.query(..., predicate="dwithin")`, then `shapely.distance` on every
pair found and the least per source. Both run on the same warm index; the answers must be
identical (same sources, nearest targets and distances). Medians of CPU time.
"""

import argparse
import statistics
import time

from seeded import seeded_demo  # bench/ is on the path when a bench runs

CASES = [
    ("tree", "house", 20.0, False),
    ("pool", "house", 5.0, False),
    ("house", "road", 50.0, False),
    ("road", "house", 10.0, False),
    ("house", "house", 10.0, False),
    ("tree", "tree", 3.0, False),
    ("garage", "pool", 100.0, False),
    ("tree", "house", 20.0, True),
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--annotations", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    seeded_demo(args.annotations)
    import numpy as np
    import shapely

    from geosense.annotations.index import ClassIndex, nearest_within, spatial_index

    index = spatial_index()

    def replaced(sources: ClassIndex, positions: np.ndarray, targets: ClassIndex, radius: float):
        hits, other = targets.tree.query(
            sources.geoms[positions], predicate="dwithin", distance=radius
        )
        if sources is targets:
            distinct = positions[hits] != other
            hits, other = hits[distinct], other[distinct]
        distances = shapely.distance(sources.geoms[positions[hits]], targets.geoms[other])
        starts = np.flatnonzero(np.r_[True, hits[1:] != hits[:-1]])
        nearest = np.minimum.reduceat(distances, starts)
        is_nearest = distances == np.repeat(nearest, np.diff(np.r_[starts, len(hits)]))
        chosen = np.minimum.reduceat(np.where(is_nearest, other, np.iinfo(np.int64).max), starts)
        return positions[hits[starts]], chosen, nearest

    def cpu_ms(fn, *fn_args):
        times, result = [], None
        for _ in range(args.runs):
            started = time.process_time()
            result = fn(*fn_args)
            times.append(time.process_time() - started)
        return statistics.median(times) * 1000, result

    print(
        "| sources → targets | within | replaced plan | nearest_within | ratio | sources found | same answer |"
    )
    print("|---|---|---|---|---|---|---|")
    for source, target, metres, in_bbox in CASES:
        sources, targets = index.classes[source], index.classes[target]
        positions = np.arange(len(sources.ids))
        label = f"{source} → {target}"
        if in_bbox:
            lon, lat = np.median(sources.bounds[:, 0]), np.median(sources.bounds[:, 1])
            positions = sources.positions_in((lon - 0.003, lat - 0.003, lon + 0.003, lat + 0.003))
            label += f" ({len(positions):,} in a bbox)"
        radius = index.search_distance(metres)
        old_ms, old = cpu_ms(replaced, sources, positions, targets, radius)
        new_ms, new = cpu_ms(nearest_within, sources, positions, targets, radius)
        same = all(np.array_equal(a, b) for a, b in zip(old, new, strict=True))
        print(
            f"| {label} | {metres:g} m | {old_ms:.1f} ms | {new_ms:.1f} ms | {new_ms / old_ms:.2f}× | "
            f"{len(new[0]):,} | {same} |"
        )


if __name__ == "__main__":
    main()
