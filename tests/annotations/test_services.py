import pytest

from geosense.annotations.models import Annotation
from geosense.annotations.selectors import (
    annotation_counts,
    annotation_list,
    annotations_similar,
    annotations_within_distance,
)
from geosense.annotations.services import (
    GeoJSONImportError,
    annotation_create,
    annotations_import_geojson,
    demo_seed,
)
from geosense.annotations.types import GeometryError

from .shapes import point, rectangle

pytestmark = pytest.mark.django_db


def rows():
    return list(
        Annotation.all_objects.order_by("id").values_list("id", "category", "geometry", "updated")
    )


def test_seed_creates_the_neighbourhood():
    report = demo_seed(annotations=600, seed=1)

    assert report.created == 600
    assert sum(annotation_counts().values()) == 600
    assert {"house", "pool", "tree", "road"} <= set(annotation_counts())


def test_seeding_twice_with_the_same_arguments_changes_nothing():
    demo_seed(annotations=500, seed=3)
    before = rows()

    report = demo_seed(annotations=500, seed=3)

    assert report.created == 0
    assert rows() == before


def test_the_same_seed_builds_the_same_neighbourhood():
    demo_seed(annotations=300, seed=9)
    first = [(c, g) for _, c, g, _ in rows()]
    Annotation.all_objects.all().delete()

    demo_seed(annotations=300, seed=9)

    assert [(c, g) for _, c, g, _ in rows()] == first


def test_seeding_other_arguments_replaces_the_earlier_demo_rows_only():
    own = annotation_create(category="tree", geometry=point(0, 0))
    demo_seed(annotations=200, seed=0)

    report = demo_seed(annotations=300, seed=0)

    assert report.replaced == 200
    assert Annotation.all_objects.count() == 301
    assert Annotation.objects.filter(pk=own.pk).exists()


def test_seeded_shapes_are_believable():
    demo_seed(annotations=2000, seed=0)

    trees = annotation_list(category="tree", limit=50)
    houses = annotation_list(category="house")
    pools = annotation_list(category="pool")
    assert all(0 < t.attributes["crown_radius_m"] < 6 for t in trees)
    assert 60 < sorted(h.area_m2 for h in houses)[len(houses) // 2] < 250
    assert all(15 < p.area_m2 < 70 for p in pools)
    assert all(r.length_m > 50 for r in annotation_list(category="road"))


def test_seed_with_a_showcase_pool_at_index_25_on_a_fresh_table():
    demo_seed(annotations=2000, seed=0)

    first_id = Annotation.all_objects.order_by("id").values_list("id", flat=True)[0]
    showcase = Annotation.objects.get(pk=first_id + 24)
    assert showcase.category == "pool"
    assert len(annotations_similar(samples=[(showcase.pk, None)], k=20)) == 20


def test_seed_refuses_more_than_a_million_annotations():
    with pytest.raises(ValueError, match="1000000"):
        demo_seed(annotations=1_000_001)


def test_trees_within_20_m_of_a_house_are_some_of_the_trees_not_all():
    """The showcase query of the README picks out a meaningful subset (issue 16, item 18):
    parks, wooded lots and sparse streets hold trees far from any house."""
    demo_seed(annotations=2000, seed=0)

    trees = annotation_counts()["tree"]
    near = annotations_within_distance(source="tree", target="house", distance_m=20)
    settings = {t.attributes["setting"] for t in annotation_list(category="tree")}

    assert 0.3 * trees < len(near.source_ids) < 0.85 * trees
    assert {"park", "wood", "garden", "street"} <= settings


def test_a_seed_of_a_million_is_refused_only_above_it():
    with pytest.raises(ValueError, match="between 0 and 1000000"):
        demo_seed(annotations=-1)


def collection(*features):
    return {"type": "FeatureCollection", "features": list(features)}


def feature(geometry, **properties):
    return {"type": "Feature", "geometry": geometry, "properties": properties}


def test_import_creates_annotations_with_measures_and_attributes():
    report = annotations_import_geojson(
        collection=collection(
            feature(rectangle(2.35, 48.85, 10, 20), kind="house", floors=3),
            feature(point(2.351, 48.851), kind="tree"),
        ),
        class_property="kind",
        source="import:paris.geojson",
    )

    house = Annotation.objects.get(category="house")
    assert report.created == 2
    assert house.area_m2 == pytest.approx(200, rel=0.005)
    assert house.attributes == {"floors": 3}
    assert house.source == "import:paris.geojson"
    assert "shape" in house.vectors


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        ({"type": "Feature"}, "FeatureCollection"),
        ({"type": "FeatureCollection"}, "features"),
        (
            collection(
                feature(point(0, 0), **{"class": "tree"}),
                feature({"type": "Point", "coordinates": [0]}, **{"class": "tree"}),
            ),
            "feature 1",
        ),
        (
            collection(
                feature(
                    {"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]},
                    **{"class": "lot"},
                )
            ),
            "Self-intersection",
        ),
        (collection(feature(point(0, 0), **{"class": ["tree"]})), "a class must be a string"),
        (
            {
                "type": "FeatureCollection",
                "crs": {"type": "name", "properties": {"name": "EPSG:3857"}},
                "features": [],
            },
            "WGS84",
        ),
    ],
)
def test_a_broken_collection_imports_nothing_and_says_why(broken, reason):
    annotation_create(category="tree", geometry=point(1, 1))

    with pytest.raises(GeoJSONImportError, match=reason):
        annotations_import_geojson(collection=broken)

    assert Annotation.all_objects.count() == 1


def test_create_refuses_an_invalid_geometry_and_bad_vectors():
    with pytest.raises(GeometryError):
        annotation_create(category="tree", geometry={"type": "Point", "coordinates": [1, 95]})
    with pytest.raises(ValueError, match="vector"):
        annotation_create(category="tree", geometry=point(1, 1), vectors={"shape": ["x"]})
    assert Annotation.all_objects.count() == 0
