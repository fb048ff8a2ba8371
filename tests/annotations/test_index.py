"""`nearest_within` against the plain answer: every distance measured, the least kept."""

import gc

import numpy as np
import pytest
import shapely

from geosense.annotations.index import ClassIndex, nearest_within


def class_index(geoms: list) -> ClassIndex:
    geoms = np.array(geoms, dtype=object)
    ids = np.arange(1, len(geoms) + 1, dtype=np.int64)
    return ClassIndex.build("thing", ids, geoms, shapely.bounds(geoms))


def plain_nearest(sources: ClassIndex, positions: np.ndarray, targets: ClassIndex, radius: float):
    found, chosen, nearest = [], [], []
    for pos in sorted(positions.tolist()):
        distances = shapely.distance(sources.geoms[pos], targets.geoms)
        if sources is targets:
            distances[pos] = np.inf
        best = distances.min(initial=np.inf)
        if best <= radius:
            found.append(pos)
            chosen.append(int(np.flatnonzero(distances == best)[0]))
            nearest.append(best)
    return found, chosen, nearest


def random_shapes(rng: np.random.Generator, n: int, spread: float, *, grid: bool = False) -> list:
    """Points, lines, rectangles and pairs of rectangles; on a 1 m grid when grid (exact ties)."""

    def at() -> np.ndarray:
        xy = rng.uniform(0, spread, 2)
        return np.round(xy) if grid else xy

    def size() -> np.ndarray:
        wh = rng.uniform(1, 25, 2)
        return np.round(wh) if grid else wh

    shapes = []
    for kind in rng.integers(0, 4, n):
        (x, y), (w, h) = at(), size()
        if kind == 0:
            shapes.append(shapely.Point(x, y))
        elif kind == 1:
            shapes.append(shapely.LineString([(x, y), (x + w, y + h), (x + 2 * w, y)]))
        elif kind == 2:
            box = shapely.box(x, y, x + w, y + h)
            shapes.append(box if grid else shapely.affinity.rotate(box, rng.uniform(0, 90)))
        else:
            shapes.append(
                shapely.MultiPolygon(
                    [
                        shapely.box(x, y, x + w, y + h),
                        shapely.box(x + w + 5, y, x + 2 * w + 5, y + h),
                    ]
                )
            )
    return shapes


def assert_agrees(
    sources: ClassIndex, positions: np.ndarray, targets: ClassIndex, radius: float
) -> int:
    found, chosen, nearest = nearest_within(sources, positions, targets, radius)
    want_found, want_chosen, want_nearest = plain_nearest(sources, positions, targets, radius)
    assert found.tolist() == want_found
    assert chosen.tolist() == want_chosen
    assert nearest.tolist() == want_nearest
    return len(found)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("grid", [False, True])
def test_nearest_within_agrees_with_measuring_every_pair(seed, grid):
    rng = np.random.default_rng(seed)
    sources = class_index(random_shapes(rng, 300, 600, grid=grid))
    targets = class_index(random_shapes(rng, 120, 600, grid=grid))
    everything = np.arange(len(sources.ids))
    some = np.sort(rng.choice(len(sources.ids), 40, replace=False))

    found = 0
    for radius in (0.0, 3.0, 20.0, 75.0):
        # Many sources and few targets, then few sources and many targets: both query directions.
        found += assert_agrees(sources, everything, targets, radius)
        found += assert_agrees(sources, some, targets, radius)
        found += assert_agrees(targets, np.arange(len(targets.ids)), sources, radius)
        found += assert_agrees(sources, everything, sources, radius)
    assert found > 300


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("grid", [False, True])
def test_a_class_of_points_agrees_with_measuring_every_pair(seed, grid):
    """A class of points takes the bounds' shorter path (`ClassIndex.points`): points on the
    grid fall on targets' sides and corners and inside them, and tie between targets."""
    rng = np.random.default_rng(100 + seed)
    xy = rng.uniform(0, 600, (400, 2))
    points = class_index(list(shapely.points(np.round(xy) if grid else xy)))
    targets = class_index(random_shapes(rng, 150, 600, grid=grid))
    assert points.points and not targets.points
    some = np.sort(rng.choice(len(points.ids), 50, replace=False))

    found = 0
    for radius in (0.0, 3.0, 20.0, 75.0):
        found += assert_agrees(points, np.arange(len(points.ids)), targets, radius)
        found += assert_agrees(points, some, targets, radius)
        found += assert_agrees(targets, np.arange(len(targets.ids)), points, radius)
        found += assert_agrees(points, np.arange(len(points.ids)), points, radius)
    assert found > 400


def test_equally_near_targets_give_the_lowest_position():
    sources = class_index([shapely.Point(0, 0)])
    targets = class_index(
        [shapely.box(3, -1, 4, 1), shapely.box(-4, -1, -3, 1), shapely.Point(0, 5)]
    )

    found, chosen, nearest = nearest_within(sources, np.array([0]), targets, 10)

    assert (found.tolist(), chosen.tolist(), nearest.tolist()) == ([0], [0], [3.0])


def test_a_source_inside_a_target_is_at_distance_zero_even_when_a_vertex_is_nearer_elsewhere():
    sources = class_index([shapely.Point(50, 1)])
    targets = class_index([shapely.Point(50.5, 1.5), shapely.box(0, 0, 100, 2)])

    found, chosen, nearest = nearest_within(sources, np.array([0]), targets, 1)

    assert (found.tolist(), chosen.tolist(), nearest.tolist()) == ([0], [1], [0.0])


def test_nothing_to_search_gives_nothing():
    sources = class_index([shapely.Point(0, 0)])
    targets = class_index([shapely.Point(100, 0)])

    assert all(len(a) == 0 for a in nearest_within(sources, np.array([0]), targets, 10))
    assert all(
        len(a) == 0 for a in nearest_within(sources, np.zeros(0, dtype=np.int64), targets, 1000)
    )


def test_garbage_collection_is_left_as_it_was_found():
    sources = class_index([shapely.Point(0, 0)])
    targets = class_index([shapely.Point(1, 0)])
    assert gc.isenabled()

    nearest_within(sources, np.array([0]), targets, 10)
    assert gc.isenabled()

    gc.disable()
    try:
        nearest_within(sources, np.array([0]), targets, 10)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_deletion_copies_a_class_while_other_threads_add_to_what_it_keeps():
    """Queries add arrays and vectors to a class as they first need them (the overview's
    dimensions, the tiles' shapes, a similarity's vectors) while a deletion may be copying that
    class in another thread: the copy reads a snapshot of them, never a dict that changes
    under it ("dictionary changed size during iteration")."""
    import sys
    import threading

    n = 200_000
    xy = np.random.default_rng(0).uniform(0, 1000, (n, 2))
    class_index = class_index_of_points(xy)
    for name in "abcdefghij":
        class_index.derived[name] = np.zeros(n)
    stop, errors = threading.Event(), []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns as often as they can: the race shows

    def meddle():
        while not stop.is_set():  # one more, one fewer, in turns
            if class_index.derived.pop("late", None) is None:
                class_index.derived["late"] = class_index.derived["a"]

    meddler = threading.Thread(target=meddle)
    meddler.start()
    drop = np.zeros(n, dtype=bool)
    drop[::1000] = True
    try:
        for _ in range(40):
            try:
                class_index.without(drop)
            except RuntimeError as exc:
                errors.append(exc)
    finally:
        stop.set()
        meddler.join()
        sys.setswitchinterval(interval)
    assert errors == []


def class_index_of_points(xy: np.ndarray) -> ClassIndex:
    geoms = shapely.points(xy)
    ids = np.arange(1, len(geoms) + 1, dtype=np.int64)
    return ClassIndex.build("thing", ids, geoms, shapely.bounds(geoms))
