"""Which engine answers the spatial questions (`geosense/annotations/spatial.py`): on SQLite the
in-process index, whatever "auto" finds; PostGIS cannot be forced onto SQLite. (On PostgreSQL:
tests/scale/test_postgis.py.)"""

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from geosense.annotations.spatial import spatial_backend


def test_sqlite_is_answered_by_the_in_process_index():
    assert spatial_backend() == "index"
    with override_settings(GEOSENSE_SPATIAL_BACKEND="index"):
        assert spatial_backend() == "index"


def test_postgis_cannot_be_forced_onto_sqlite():
    with override_settings(GEOSENSE_SPATIAL_BACKEND="postgis"):
        with pytest.raises(ImproperlyConfigured, match="needs PostgreSQL"):
            spatial_backend()
