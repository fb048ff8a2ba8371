"""Annotations: shapes drawn over a place, each with a class, measures and feature vectors."""

import uuid

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection, models, transaction

from geosense import wire
from geosense.compiled import CompiledRead

from .types import CLASS_MAX_LENGTH


class LiveAnnotationManager(models.Manager):
    """Every query of the app goes through this manager: soft-deleted annotations vanish."""

    def get_queryset(self):
        return super().get_queryset().filter(deleted_at__isnull=True)


class Annotation(models.Model):
    # The integer id is the one the agent and the markup talk about (`<ref id>`, `ids`).
    category = models.CharField("class", max_length=CLASS_MAX_LENGTH, db_index=True)
    # WGS84 GeoJSON geometry (Point, LineString or Polygon): portable across SQLite and
    # PostgreSQL; the bounding box columns below make bbox filters indexable.
    geometry = models.JSONField()
    min_lon = models.FloatField()
    min_lat = models.FloatField()
    max_lon = models.FloatField()
    max_lat = models.FloatField()
    area_m2 = models.FloatField(default=0.0, help_text="Geodesic area (polygons).")
    length_m = models.FloatField(
        default=0.0, help_text="Geodesic length, or a polygon's perimeter."
    )
    attributes = models.JSONField(default=dict, blank=True)
    # Named feature vectors for similarity search: {"shape": [..], "<name>": [..]}.
    vectors = models.JSONField(default=dict, blank=True)
    source = models.CharField(max_length=64, blank=True, help_text="seed_demo, an import file, …")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    deleted_at = models.DateTimeField(null=True, blank=True, db_index=True)

    objects = LiveAnnotationManager()
    all_objects = models.Manager()

    class Meta:
        base_manager_name = "all_objects"
        indexes = [models.Index(fields=["min_lon", "min_lat", "max_lon", "max_lat"])]

    def __str__(self) -> str:
        return f"{self.category} {self.pk}"

    @property
    def is_deleted(self) -> bool:
        return self.deleted_at is not None


# The transaction-level advisory lock that every write of the kept nearest table takes first
# (`pg_advisory_xact_lock`: its trigger, its rebuild, and `AnnotationRevision.bump`), so that
# annotation writers on PostgreSQL follow one another (migration annotations/0007).
NEAREST_LOCK = 180_007


class AnnotationRevision(models.Model):
    """One row whose token changes on every write to annotations.

    Spatial indexes cached in a process compare it with the token they were built at, so
    writes by any process are seen at the cost of one primary-key read. A random token
    (not a counter) stays unambiguous when a transaction that bumped it is rolled back.
    """

    token = models.CharField(max_length=32)
    # Changes with the token on writes of content (create, import, edit, seed), and stays on a
    # soft delete or restore: an index built at the same generation catches up with those by
    # reading the deleted ids alone (`index.py`), with no rebuild.
    generation = models.CharField(max_length=32, default="")

    def __str__(self) -> str:
        return f"annotations revision {self.token}"

    @classmethod
    def current(cls) -> str:
        return cls.objects.filter(pk=1).values_list("token", flat=True).first() or ""

    @classmethod
    def state(cls) -> tuple[str, str]:
        """(token, generation) as of now; ("", "") before the first write."""
        rows = _STATE.rows()
        return (rows[0][0], rows[0][1]) if rows else ("", "")

    @classmethod
    def bump(cls, *, content: bool = True) -> str:
        """A new token (and generation when content changed); returns the token. Every open
        page hears of it once the transaction commits (`annotations-changed`).

        On PostgreSQL it first takes the kept nearest table's lock (`NEAREST_LOCK`, re-entrant
        within a transaction), so every writer takes that lock before this row, as every
        statement writing annotations takes it before their rows (migration annotations/0009):
        a writer that bumped before its first trigger run or its rebuild (a seed, an import)
        held this row while waiting for the lock that a concurrent delete held while waiting
        for this row."""
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [NEAREST_LOCK])
        token = uuid.uuid4().hex
        values = {"token": token, "generation": token} if content else {"token": token}
        if not cls.objects.filter(pk=1).update(**values):
            cls.objects.update_or_create(pk=1, defaults={"token": token, "generation": token})
        transaction.on_commit(lambda: _announce(token), robust=True)
        return token


# Read by every query of the index and every step's prompt: compiled once per process.
_STATE = CompiledRead(
    build=lambda: AnnotationRevision.objects.filter(pk=1).values_list("token", "generation")[:1],
    tail=lambda connection: [1],
)


def _announce(token: str) -> None:
    """Tell every open page (`annotations-changed`), through the channel layer: through Redis
    that reaches every process; the in-memory layer reaches only this one."""
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(
            wire.ANNOTATIONS_GROUP, wire.annotations_changed_message(token)
        )


class DemoArea(models.Model):
    """The demo neighbourhood `seed_demo` made last: its blocks (i, j, kind), from which the
    map's quiet base layer draws the blocks, lots and parks (`base.py`). One row at most."""

    seed = models.IntegerField()
    annotations = models.IntegerField()
    blocks = models.JSONField(default=list)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"demo area of {self.annotations} annotations (seed {self.seed})"
