import io
import json

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from geosense.accounts.services import api_token_user
from geosense.annotations.models import Annotation

pytestmark = pytest.mark.django_db


def run(*args):
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_seed_demo_says_what_it_did_and_then_that_nothing_changed():
    first = run("seed_demo", "--annotations", "300")
    second = run("seed_demo", "--annotations", "300")

    assert "Seeded 300 annotations around Encino" in first
    assert "demo / demo" in first
    assert "nothing changed" in second
    assert Annotation.objects.count() == 300
    assert get_user_model().objects.get(username="demo").check_password("demo")


def test_api_token_prints_one_line_that_authenticates_the_user():
    user = get_user_model().objects.create_user(username="ben", password="pw")

    output = run("api_token", "ben")

    assert output.count("\n") == 1
    assert api_token_user(raw=output.strip()) == user


def test_api_token_for_an_unknown_user_fails():
    with pytest.raises(CommandError, match="nobody"):
        run("api_token", "nobody")


def test_import_geojson_reads_a_file_with_a_class_property(tmp_path):
    path = tmp_path / "parks.geojson"
    path.write_text(
        json.dumps(
            {
                "type": "FeatureCollection",
                "features": [
                    {
                        "type": "Feature",
                        "id": "p1",
                        "properties": {"landuse": "park"},
                        "geometry": {
                            "type": "Polygon",
                            "coordinates": [[[0, 0], [0.001, 0], [0.001, 0.001], [0, 0]]],
                        },
                    },
                ],
            }
        )
    )

    output = run("import_geojson", str(path), "--class-property", "landuse")

    park = Annotation.objects.get()
    assert output.endswith("parks.geojson: 1 new\n")
    assert park.category == "park"
    assert park.attributes == {"feature_id": "p1"}


def test_import_geojson_of_broken_json_imports_nothing_and_says_why(tmp_path):
    path = tmp_path / "broken.geojson"
    path.write_text('{"type": "FeatureCollection", "features": [')

    with pytest.raises(CommandError, match=r"not valid JSON.*nothing imported"):
        run("import_geojson", str(path))
    assert Annotation.all_objects.count() == 0


def test_seed_demo_reset_restores_deleted_demo_annotations_with_their_ids_and_the_credits():
    from geosense.accounts.services import credit_balance, credit_set
    from geosense.annotations.models import AnnotationRevision
    from geosense.annotations.services import annotations_soft_delete

    run("seed_demo", "--annotations", "300")
    ids = sorted(Annotation.objects.values_list("id", flat=True))
    annotations_soft_delete(ids=ids[:3])
    demo = get_user_model().objects.get(username="demo")
    credit_set(user=demo, balance=7)
    demo.set_password("forgotten")
    demo.is_active = False
    demo.save()
    revision = AnnotationRevision.current()

    output = run("seed_demo", "--annotations", "300", "--reset")

    assert "Demo reset: 300 annotations" in output
    assert "3 deleted ones restored" in output
    assert sorted(Annotation.objects.values_list("id", flat=True)) == ids
    assert AnnotationRevision.current() != revision  # every process's index sees it
    demo.refresh_from_db()
    assert demo.is_active and demo.check_password("demo")
    assert credit_balance(user=demo) == 100


def test_seed_demo_reset_on_an_empty_database_seeds_it():
    output = run("seed_demo", "--annotations", "50", "--reset")

    assert "Seeded 50 annotations" in output
    assert Annotation.objects.count() == 50
    assert get_user_model().objects.get(username="demo").check_password("demo")
