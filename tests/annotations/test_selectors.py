import numpy as np
import pytest
import shapely
from pyproj import CRS, Geod, Transformer
from shapely.geometry import shape

from geosense.annotations.selectors import (
    annotation_counts,
    annotation_list,
    annotation_measures,
    annotation_overview,
    annotations_geojson,
    annotations_nearest,
    annotations_overlapping,
    annotations_similar,
    annotations_similar_by_hint,
    annotations_typical,
    annotations_within_distance,
    stable_order,
)
from geosense.annotations.services import (
    annotation_create,
    annotations_restore,
    annotations_soft_delete,
)
from geosense.annotations.types import AnnotationNotFound, ClassNotFound, VectorNotFound

from .shapes import line, point, rectangle

GEOD = Geod(ellps="WGS84")
LON, LAT = 151.2, -33.8
pytestmark = pytest.mark.django_db


def scatter(rng, n, spread_m):
    dx, dy = rng.uniform(-spread_m, spread_m, (2, n))
    return LON + dx / (111_320 * np.cos(np.radians(LAT))), LAT + dy / 111_320


UTM = Transformer.from_crs(
    "EPSG:4326",
    CRS.from_proj4(f"+proj=utm +zone={int((LON + 180) // 6) + 1} +south +datum=WGS84"),
    always_xy=True,
)


def utm(geometry):
    """The geometry in its UTM zone: an independent metric frame for brute-force checks."""
    return shapely.transform(
        shape(geometry), lambda c: np.column_stack(UTM.transform(c[:, 0], c[:, 1]))
    )


@pytest.fixture
def yard():
    """Random trees (points) and houses (rectangles) over a few hundred metres."""
    rng = np.random.default_rng(7)
    trees = [
        annotation_create(category="tree", geometry=point(x, y))
        for x, y in zip(*scatter(rng, 150, 300), strict=True)
    ]
    houses = [
        annotation_create(category="house", geometry=rectangle(x, y, w, h, turn_deg=t))
        for x, y, w, h, t in zip(
            *scatter(rng, 60, 300),
            rng.uniform(6, 20, 60),
            rng.uniform(6, 20, 60),
            rng.uniform(0, 90, 60),
            strict=True,
        )
    ]
    return trees, houses


def test_within_distance_agrees_with_brute_force(yard):
    trees, houses = yard
    limit = 25.0
    brute = {}
    for tree in trees:
        distances = sorted((utm(tree.geometry).distance(utm(h.geometry)), h.id) for h in houses)
        brute[tree.id] = distances

    pairs = annotations_within_distance(source="tree", target="house", distance_m=limit)

    found = {p.source_id: p for p in pairs}
    for tree_id, distances in brute.items():
        nearest, runner_up = distances[0], distances[1]
        if abs(nearest[0] - limit) < 0.005 * limit:
            continue
        assert (tree_id in found) == (nearest[0] <= limit)
        if tree_id in found:
            assert abs(found[tree_id].distance_m - nearest[0]) <= 0.005 * max(nearest[0], 1.0)
            if runner_up[0] - nearest[0] > 0.01:
                assert found[tree_id].target_id == nearest[1]
    assert len(found) > 20
    assert [p.distance_m for p in pairs] == sorted(p.distance_m for p in pairs)


def test_within_distance_is_geodesic_for_data_spread_over_a_continent():
    rng = np.random.default_rng(3)
    lons, lats = rng.uniform(110, 150, 80), rng.uniform(-40, -12, 80)
    wells = [
        annotation_create(category="well", geometry=point(x, y))
        for x, y in zip(lons, lats, strict=True)
    ]
    towns = [
        annotation_create(category="town", geometry=point(x + 0.3, y + 0.2))
        for x, y in zip(lons[:40], lats[:40], strict=True)
    ]
    limit = 400_000.0

    pairs = annotations_within_distance(source="well", target="town", distance_m=limit)

    for pair in pairs:
        well = next(w for w in wells if w.id == pair.source_id)
        distances = {
            t.id: GEOD.inv(*well.geometry["coordinates"], *t.geometry["coordinates"])[2]
            for t in towns
        }
        assert abs(pair.distance_m - distances[pair.target_id]) <= 0.005 * distances[pair.target_id]
        assert pair.distance_m <= min(distances.values()) * 1.005
    brute_count = sum(
        min(GEOD.inv(*w.geometry["coordinates"], *t.geometry["coordinates"])[2] for t in towns)
        <= limit * 0.995
        for w in wells
    )
    assert len(pairs) >= brute_count > 0


def test_an_annotation_is_never_its_own_neighbour():
    a = annotation_create(category="tree", geometry=point(LON, LAT))
    b = annotation_create(category="tree", geometry=point(LON + 0.0001, LAT))

    pairs = annotations_within_distance(source="tree", target="tree", distance_m=50)

    assert {(p.source_id, p.target_id) for p in pairs} == {(a.id, b.id), (b.id, a.id)}
    assert 9 < pairs[0].distance_m < 10


def test_overlap_share_agrees_with_brute_force():
    rng = np.random.default_rng(11)
    pools = [
        annotation_create(category="pool", geometry=rectangle(x, y, w, 5))
        for x, y, w in zip(*scatter(rng, 80, 120), rng.uniform(4, 12, 80), strict=True)
    ]
    houses = [
        annotation_create(category="house", geometry=rectangle(x, y, 15, 12, turn_deg=t))
        for x, y, t in zip(*scatter(rng, 50, 120), rng.uniform(0, 90, 50), strict=True)
    ]

    pairs = annotations_overlapping(source="pool", target="house")

    found = {p.source_id: p for p in pairs}
    for pool in pools:
        own = utm(pool.geometry)
        shares = sorted(
            ((own.intersection(utm(h.geometry)).area / own.area, h.id) for h in houses),
            reverse=True,
        )
        best = shares[0]
        if best[0] == 0:
            assert pool.id not in found
            continue
        assert abs(found[pool.id].share - best[0]) < 0.002
        if best[0] - shares[1][0] > 0.01:
            assert found[pool.id].target_id == best[1]
    assert len(found) > 5
    assert [p.share for p in pairs] == sorted((p.share for p in pairs), reverse=True)


def test_a_panel_inside_a_roof_overlaps_it_entirely_and_a_point_inside_counts_as_whole():
    house = annotation_create(category="house", geometry=rectangle(LON, LAT, 20, 20))
    panel = annotation_create(category="solar_panel", geometry=rectangle(LON, LAT, 4, 2))
    tree = annotation_create(category="tree", geometry=point(LON, LAT))

    assert annotations_overlapping(source="solar_panel", target="house")[0].share == pytest.approx(
        1.0
    )
    assert annotations_overlapping(source="tree", target="house")[0].target_id == house.id
    assert panel.id != tree.id


def test_nearest_agrees_with_brute_force(yard):
    trees, houses = yard
    here = (LON + 0.0005, LAT - 0.0003)
    everything = [(GEOD.inv(*here, *t.geometry["coordinates"])[2], t.id) for t in trees]
    everything += [(utm(point(*here)).distance(utm(h.geometry)), h.id) for h in houses]

    hits = annotations_nearest(lon=here[0], lat=here[1], k=6)

    expected = sorted(everything)[:6]
    assert [h.id for h in hits] == [i for _, i in expected]
    for hit, (metres, _) in zip(hits, expected, strict=True):
        assert abs(hit.distance_m - metres) <= 0.005 * max(metres, 1.0)


def test_nearest_of_one_class_only_answers_that_class(yard):
    hits = annotations_nearest(lon=LON, lat=LAT, category="house", k=3)

    assert [h.category for h in hits] == ["house"] * 3


def test_similarity_ranks_the_samples_near_duplicates_first():
    rng = np.random.default_rng(5)
    sample = annotation_create(category="pool", geometry=rectangle(LON, LAT, 12, 4, turn_deg=10))
    twins = [
        annotation_create(
            category="pool",
            geometry=rectangle(LON + 0.001 * i, LAT, 12 + 0.1 * i, 4.05, turn_deg=10 + i),
        )
        for i in range(1, 4)
    ]
    for x, y, w, h, t in zip(
        *scatter(rng, 40, 500),
        rng.uniform(3, 30, 40),
        rng.uniform(3, 30, 40),
        rng.uniform(0, 180, 40),
        strict=True,
    ):
        annotation_create(category="pool", geometry=rectangle(x, y, w, h, turn_deg=t))

    hits = annotations_similar(samples=[(sample.id, None)], k=5)

    assert {h.id for h in hits[:3]} == {t.id for t in twins}
    assert sample.id not in {h.id for h in hits}
    assert hits[0].score >= hits[-1].score


def test_similarity_uses_the_named_vector_of_a_sample():
    sample = annotation_create(
        category="roof", geometry=point(LON, LAT), vectors={"colour": [1.0, 0.0, 0.0]}
    )
    red = annotation_create(
        category="roof", geometry=point(LON, LAT + 0.001), vectors={"colour": [0.9, 0.1, 0.0]}
    )
    annotation_create(
        category="roof", geometry=point(LON, LAT + 0.002), vectors={"colour": [0.0, 1.0, 0.2]}
    )
    annotation_create(
        category="roof", geometry=point(LON, LAT + 0.003), vectors={"colour": [0.1, 0.1, 1.0]}
    )

    hits = annotations_similar(samples=[(sample.id, "colour")], k=1)

    assert [h.id for h in hits] == [red.id]


def test_a_search_by_class_ranks_the_most_typical_members_first():
    def roof(lat_step: float, colour: list[float]):
        return annotation_create(
            category="roof", geometry=point(LON, LAT + lat_step), vectors={"shape": colour}
        )

    typical = [roof(0.001 * i, [1.0 + 0.01 * i, 1.0, 0.1]) for i in range(5)]
    odd = roof(0.01, [0.0, 0.1, 3.0])

    hits = annotations_typical(category="roof", k=6)

    assert {h.id for h in hits[:5]} == {r.id for r in typical}
    assert hits[-1].id == odd.id and hits[0].score > hits[-1].score
    assert annotations_typical(category="castle", k=5) == []


def test_the_readers_search_takes_a_hint_alone_as_its_class():
    pools = [
        annotation_create(category="pool", geometry=rectangle(LON + 0.001 * i, LAT, 5 + i, 4))
        for i in range(4)
    ]
    annotation_create(category="house", geometry=rectangle(LON, LAT + 0.01, 12, 10))

    search = annotations_similar_by_hint(samples=[], hint="Pools", k=3)

    assert search.category == "pool" and len(search.hits) == 3
    assert {h.id for h in search.hits} <= {p.id for p in pools}
    with pytest.raises(ClassNotFound):
        annotations_similar_by_hint(samples=[], hint="unicorn", k=3)


def test_similarity_refuses_unknown_samples_and_vectors():
    sample = annotation_create(category="pool", geometry=rectangle(LON, LAT, 5, 5))

    with pytest.raises(AnnotationNotFound):
        annotations_similar(samples=[(sample.id + 1000, None)])
    with pytest.raises(VectorNotFound):
        annotations_similar(samples=[(sample.id, "colour")])


def test_soft_deleted_annotations_vanish_from_every_query_and_come_back_after_restore():
    house = annotation_create(category="house", geometry=rectangle(LON, LAT, 12, 10))
    tree = annotation_create(category="tree", geometry=point(LON + 0.0001, LAT))
    other = annotation_create(category="house", geometry=rectangle(LON + 0.01, LAT, 12, 10))
    bbox = (LON - 0.001, LAT - 0.001, LON + 0.001, LAT + 0.001)

    assert annotations_soft_delete(ids=[house.id, house.id]) == [house.id]

    assert annotation_counts() == {"house": 1, "tree": 1}
    assert annotation_counts(bbox=bbox) == {"tree": 1}
    assert [a.id for a in annotation_list(category="house")] == [other.id]
    assert len(annotations_within_distance(source="tree", target="house", distance_m=100)) == 0
    assert annotations_overlapping(source="tree", target="house") == []
    assert house.id not in {h.id for h in annotations_nearest(lon=LON, lat=LAT, k=5)}
    assert house.id not in {f["id"] for f in annotations_geojson()["features"]}
    with pytest.raises(AnnotationNotFound):
        annotation_measures(annotation_id=house.id)
    assert annotations_soft_delete(ids=[house.id]) == []

    assert annotations_restore(ids=[house.id, tree.id]) == [house.id]

    assert annotation_counts(bbox=bbox) == {"house": 1, "tree": 1}
    assert (
        annotations_within_distance(source="tree", target="house", distance_m=100)[0].target_id
        == house.id
    )
    assert annotation_measures(annotation_id=house.id).id == house.id


def test_annotation_list_orders_filters_and_limits():
    small = annotation_create(
        category="pool", geometry=rectangle(LON, LAT, 3, 3), attributes={"shape": "square"}
    )
    large = annotation_create(category="pool", geometry=rectangle(LON + 0.001, LAT, 10, 5))
    annotation_create(category="house", geometry=rectangle(LON, LAT + 0.001, 30, 30))

    biggest = annotation_list(category="pool", order_by="-area_m2", limit=1)
    chosen = annotation_list(ids=[small.id])

    assert [a.id for a in biggest] == [large.id]
    assert biggest[0].area_m2 == pytest.approx(50, rel=0.01)
    assert chosen[0].attributes == {"shape": "square"}
    assert chosen[0].centroid_lon == pytest.approx(LON, abs=1e-6)
    assert chosen[0].centroid_lat == pytest.approx(LAT, abs=1e-6)
    with pytest.raises(ValueError, match="order_by"):
        annotation_list(order_by="area_m2; drop table")


def test_measures_of_a_polygon_include_its_perimeter_and_bbox():
    house = annotation_create(
        category="house", geometry=rectangle(LON, LAT, 20, 10), attributes={"storeys": 2}
    )

    measures = annotation_measures(annotation_id=house.id)

    assert measures.geometry_type == "Polygon"
    assert measures.area_m2 == pytest.approx(200, rel=0.005)
    assert measures.perimeter_m == pytest.approx(60, rel=0.005)
    assert measures.bbox[0] < LON < measures.bbox[2]
    assert measures.attributes == {"storeys": 2}


def test_geojson_features_carry_id_class_measures_and_attributes():
    road = annotation_create(
        category="road",
        geometry={"type": "LineString", "coordinates": [[LON, LAT], [LON + 0.01, LAT]]},
        attributes={"name": "George St", "class": "spoof"},
    )

    collection = annotations_geojson(category="road")

    feature = collection["features"][0]
    assert collection["type"] == "FeatureCollection"
    assert feature["id"] == road.id
    assert feature["properties"]["class"] == "road"
    assert feature["properties"]["name"] == "George St"
    assert feature["properties"]["length_m"] == pytest.approx(925, rel=0.01)
    assert feature["geometry"]["type"] == "LineString"


def test_within_distance_between_polygons_agrees_with_brute_force():
    rng = np.random.default_rng(21)
    sheds = [
        annotation_create(category="shed", geometry=rectangle(x, y, 3, 2.5, turn_deg=t))
        for x, y, t in zip(*scatter(rng, 60, 200), rng.uniform(0, 90, 60), strict=True)
    ]
    houses = [
        annotation_create(category="house", geometry=rectangle(x, y, 14, 10, turn_deg=t))
        for x, y, t in zip(*scatter(rng, 40, 200), rng.uniform(0, 90, 40), strict=True)
    ]
    limit = 15.0

    pairs = {
        p.source_id: p
        for p in annotations_within_distance(source="shed", target="house", distance_m=limit)
    }

    for shed in sheds:
        nearest = min(utm(shed.geometry).distance(utm(h.geometry)) for h in houses)
        if abs(nearest - limit) < 0.005 * limit:
            continue
        assert (shed.id in pairs) == (nearest <= limit)
        if shed.id in pairs:
            assert abs(pairs[shed.id].distance_m - nearest) <= 0.005 * max(nearest, 1.0)
    assert len(pairs) > 5


def test_annotation_list_takes_more_ids_than_one_sql_statement_can_hold():
    first = annotation_create(category="pool", geometry=rectangle(LON, LAT, 3, 3))
    second = annotation_create(category="pool", geometry=rectangle(LON, LAT, 5, 5))
    many = [*range(first.id + 10_000, first.id + 45_000), second.id, first.id]

    rows = annotation_list(ids=many, order_by="-area_m2", limit=5)

    assert [r.id for r in rows] == [second.id, first.id]


def test_the_overview_counts_each_class_and_says_what_its_shapes_are():
    annotation_create(category="house", geometry=rectangle(LON, LAT, 12, 10))
    annotation_create(category="tree", geometry=point(LON + 0.0001, LAT))
    annotation_create(category="road", geometry=line((LON, LAT), (LON + 0.001, LAT)))
    annotation_create(category="misc", geometry=point(LON, LAT + 0.001))
    annotation_create(category="misc", geometry=rectangle(LON, LAT + 0.002, 5, 5))

    overview = annotation_overview()

    assert overview.counts == {"house": 1, "misc": 2, "road": 1, "tree": 1}
    assert overview.shapes == {
        "house": "polygon",
        "misc": "mixed",
        "road": "line",
        "tree": "point",
    }
    annotations_soft_delete(ids=[a.id for a in annotation_list(category="road")])
    assert "road" not in annotation_overview().shapes


def test_a_deletion_or_restore_changes_only_its_class_shape_and_measures_no_other(monkeypatch):
    """A class's dimensions are kept with it: after a deletion the overview measures no
    geometry again, and a mixed class that lost its only point is a class of polygons."""
    from geosense.annotations import selectors

    annotation_create(category="house", geometry=rectangle(LON, LAT, 12, 10))
    lone = annotation_create(category="misc", geometry=point(LON, LAT + 0.001))
    annotation_create(category="misc", geometry=rectangle(LON, LAT + 0.002, 5, 5))
    assert annotation_overview().shapes == {"house": "polygon", "misc": "mixed"}
    measured = []
    real = shapely.get_dimensions
    monkeypatch.setattr(
        selectors.shapely,
        "get_dimensions",
        lambda geoms: measured.append(len(geoms)) or real(geoms),
    )

    annotations_soft_delete(ids=[lone.id])
    assert annotation_overview().shapes == {"house": "polygon", "misc": "polygon"}
    assert measured == []

    annotations_restore(ids=[lone.id])  # the class is built again: only its shapes are measured
    assert annotation_overview().shapes == {"house": "polygon", "misc": "mixed"}
    assert measured == [2]


@pytest.mark.parametrize("seed", range(5))
def test_stable_order_is_a_stable_argsort(seed):
    """Ties (many, in runs of any length, at the ends too) come in index order."""
    rng = np.random.default_rng(seed)
    for values in (
        rng.integers(0, 20, 500).astype(float),
        rng.uniform(0, 1, 500),
        np.r_[np.zeros(7), rng.integers(0, 3, 50).astype(float), np.full(9, 5.0)],
        np.array([2.0, 1.0, 2.0, 1.0]),
        np.zeros(0),
        np.ones(1),
    ):
        assert stable_order(values).tolist() == np.argsort(values, kind="stable").tolist()


def test_the_overview_at_a_revision_read_by_the_caller_reads_no_row_unless_it_changed(
    monkeypatch,
):
    """A step reads the annotations' revision with its tools (chat/selectors.py): at the
    token of the index kept, the overview takes that index without a statement; at any other
    token (a write since, by this process or another) it asks the index, which catches up."""
    from geosense.annotations.models import AnnotationRevision
    from tests.chat.costs import Costs

    annotation_create(category="house", geometry=rectangle(LON, LAT, 12, 10))
    assert annotation_overview().counts == {"house": 1}
    revision = AnnotationRevision.state()
    with monkeypatch.context() as patched:
        costs = Costs(patched)
        assert annotation_overview(revision=revision).counts == {"house": 1}
    assert costs.statements == []
    annotation_create(category="tree", geometry=point(LON + 0.0001, LAT))
    assert annotation_overview(revision=AnnotationRevision.state()).counts == {
        "house": 1,
        "tree": 1,
    }
