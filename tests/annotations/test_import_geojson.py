"""`import_geojson` run twice, and on features without a class: a stable feature id updates its
annotation in place, a file without ids is not imported twice, a feature without a class is
skipped and reported or takes `--default-class`."""

import io
import json

import pytest
from django.core.management import CommandError, call_command

from geosense.annotations.models import Annotation
from geosense.annotations.services import GeoJSONImportError, annotations_import_geojson

from .shapes import point, rectangle

pytestmark = pytest.mark.django_db


def run(*args):
    out = io.StringIO()
    call_command("import_geojson", *args, stdout=out)
    return out.getvalue()


def write(path, *features):
    path.write_text(json.dumps({"type": "FeatureCollection", "features": list(features)}))
    return str(path)


def feature(geometry, feature_id=None, **properties):
    found = {"type": "Feature", "geometry": geometry, "properties": properties}
    if feature_id is not None:
        found["id"] = feature_id
    return found


def test_a_second_import_of_a_file_updates_its_features_in_place(tmp_path):
    path = tmp_path / "lots.geojson"
    write(
        path,
        feature(rectangle(2.35, 48.85, 10, 20), "a", **{"class": "house"}),
        feature(point(2.351, 48.851), "b", **{"class": "tree"}),
    )
    first = run(str(path))
    ids = dict(Annotation.objects.values_list("attributes__feature_id", "id"))
    write(
        path,
        feature(rectangle(2.35, 48.85, 12, 20), "a", **{"class": "garage"}),
        feature(point(2.351, 48.851), "b", **{"class": "tree"}),
        feature(point(2.352, 48.852), "c", **{"class": "tree"}),
    )

    second = run(str(path))

    assert "2 new" in first
    assert "1 new, 1 updated, 1 unchanged" in second
    assert Annotation.objects.count() == 3
    garage = Annotation.objects.get(pk=ids["a"])
    assert garage.category == "garage" and garage.area_m2 == pytest.approx(240, rel=0.01)
    assert Annotation.objects.get(pk=ids["b"]).category == "tree"


def test_an_update_keeps_a_deleted_annotation_deleted(tmp_path):
    path = write(tmp_path / "one.geojson", feature(point(0, 0), 7, **{"class": "tree"}))
    run(path)
    Annotation.objects.update(deleted_at="2026-01-01T00:00:00Z")
    write(tmp_path / "one.geojson", feature(point(0.001, 0), 7, **{"class": "tree"}))

    output = run(path)

    assert "1 updated" in output and Annotation.all_objects.count() == 1
    assert Annotation.objects.count() == 0


def test_a_file_without_feature_ids_is_refused_the_second_time(tmp_path):
    path = write(tmp_path / "anon.geojson", feature(point(0, 0), **{"class": "tree"}))
    run(path)

    with pytest.raises(CommandError, match=r"imported before.*no id.*nothing imported"):
        run(path)
    assert Annotation.all_objects.count() == 1


def test_an_id_property_names_the_features(tmp_path):
    path = tmp_path / "refs.geojson"
    write(path, feature(point(0, 0), ref="T1", **{"class": "tree"}))
    run(str(path), "--id-property", "ref")
    write(path, feature(point(0.001, 0), ref="T1", **{"class": "oak"}))

    output = run(str(path), "--id-property", "ref")

    assert "1 updated" in output
    assert list(Annotation.objects.values_list("category", flat=True)) == ["oak"]


def test_a_feature_without_a_class_is_skipped_and_reported(tmp_path):
    path = write(
        tmp_path / "mixed.geojson",
        feature(point(0, 0), **{"class": "tree"}),
        feature(point(0.001, 0)),
        feature(point(0.002, 0), **{"class": "  "}),
    )

    output = run(path)

    assert "1 new" in output
    assert "skipped 2 features without a class (features 1 and 2; see --default-class)" in output
    assert list(Annotation.objects.values_list("category", flat=True)) == ["tree"]


def test_a_default_class_is_given_to_features_without_one(tmp_path):
    path = write(
        tmp_path / "mixed.geojson",
        feature(point(0, 0), **{"class": "tree"}),
        feature(point(0.001, 0)),
    )

    output = run(path, "--default-class", "unknown")

    assert "2 new" in output and "skipped" not in output
    assert sorted(Annotation.objects.values_list("category", flat=True)) == ["tree", "unknown"]


def test_an_id_given_twice_in_one_file_imports_nothing():
    twice = {
        "type": "FeatureCollection",
        "features": [feature(point(0, 0), 1, **{"class": "tree"})] * 2,
    }
    with pytest.raises(GeoJSONImportError, match="feature 1: the id 1 is also feature 0's"):
        annotations_import_geojson(collection=twice, source="import:twice.geojson")
    assert Annotation.all_objects.count() == 0
