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
    assert "Imported 1 annotations" in output
    assert park.category == "park"
    assert park.attributes == {"feature_id": "p1"}


def test_import_geojson_of_broken_json_imports_nothing_and_says_why(tmp_path):
    path = tmp_path / "broken.geojson"
    path.write_text('{"type": "FeatureCollection", "features": [')

    with pytest.raises(CommandError, match=r"not valid JSON.*nothing imported"):
        run("import_geojson", str(path))
    assert Annotation.all_objects.count() == 0
