"""Plain values the annotations services return: frozen dataclasses, no model instances."""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

BBox = tuple[float, float, float, float]
"""(min_lon, min_lat, max_lon, max_lat) in WGS84 degrees."""

DEFAULT_VECTOR = "shape"
#: The demo's second vector kind: what lies around an annotation (geometry.context_vectors).
CONTEXT_VECTOR = "context"
#: A class name ("house", "pool") has 1 to this many characters (the models, imports and the
#: tools' schemas all use it).
CLASS_MAX_LENGTH = 64
#: A similarity search takes at most this many samples and returns at most this many hits
#: (the `similarity_search` tool, a find-similar block and the page's button alike).
SIMILAR_SAMPLES_MAX = 20
SIMILAR_K_MAX = 200


class AnnotationNotFound(LookupError):
    """An id that names no live annotation (unknown or soft-deleted); `ids` are those ids."""

    def __init__(self, message: str, ids: list[int] | None = None) -> None:
        super().__init__(message)
        self.ids = list(ids or [])


class VectorNotFound(LookupError):
    """A sample annotation has no feature vector of the requested name."""


class ClassNotFound(LookupError):
    """A search by class (a find-similar hint with no samples) names no class of the data."""


class GeometryError(ValueError):
    """A geometry that is not a valid WGS84 Point, LineString or Polygon (or a Multi- of them)."""


@dataclass(frozen=True, slots=True)
class AnnotationSummary:
    id: int
    category: str
    area_m2: float
    length_m: float
    attributes: dict[str, Any]
    centroid_lat: float
    centroid_lon: float


@dataclass(frozen=True, slots=True)
class WithinPair:
    source_id: int
    target_id: int
    distance_m: float


@dataclass(frozen=True, slots=True)
class WithinPairs:
    """Aligned arrays, one entry per source: its id, its nearest target's id and the metres
    between them. Columns, because an answer can hold a hundred thousand pairs; iterating
    yields `WithinPair`s."""

    source_ids: np.ndarray
    target_ids: np.ndarray
    distances_m: np.ndarray

    def __len__(self) -> int:
        return len(self.source_ids)

    def __getitem__(self, i: int) -> WithinPair:
        return WithinPair(
            int(self.source_ids[i]), int(self.target_ids[i]), float(self.distances_m[i])
        )

    def __iter__(self) -> Iterator[WithinPair]:
        for s, t, d in zip(
            self.source_ids.tolist(),
            self.target_ids.tolist(),
            self.distances_m.tolist(),
            strict=True,
        ):
            yield WithinPair(s, t, d)


@dataclass(frozen=True, slots=True)
class OverlapPair:
    source_id: int
    target_id: int
    share: float


@dataclass(frozen=True, slots=True)
class NearestHit:
    id: int
    category: str
    distance_m: float


@dataclass(frozen=True, slots=True)
class SimilarHit:
    id: int
    category: str
    score: float


@dataclass(frozen=True, slots=True)
class SimilarSearch:
    """A find-similar search as the reader runs it: the class searched and its hits."""

    category: str | None
    hits: list[SimilarHit]


Shape = Literal["point", "line", "polygon", "mixed"]
"""What a class's geometries are: points have no measure, lines a length, polygons an area
and a perimeter; "mixed" when a class holds more than one kind."""


@dataclass(frozen=True, slots=True)
class DatasetOverview:
    """The live annotations per class and what each class's shapes are (every turn's agent
    reads it: an LLM in its system prompt, the local agent as data)."""

    counts: dict[str, int]
    shapes: dict[str, Shape]


@dataclass(frozen=True, slots=True)
class AnnotationMeasures:
    id: int
    category: str
    geometry_type: str
    area_m2: float
    length_m: float
    perimeter_m: float
    centroid_lat: float
    centroid_lon: float
    bbox: BBox
    attributes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What an import did: annotations made, changed in place and left as they were (matched by
    feature id), and the positions of the features skipped for want of a class."""

    created: int
    updated: int
    unchanged: int
    skipped: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SeedReport:
    place: str
    created: int
    replaced: int
    total: int
