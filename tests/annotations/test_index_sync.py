"""The index follows soft deletions and restores without a rebuild, and equals a fresh one."""

import numpy as np
import pytest

from geosense.annotations import index as index_module
from geosense.annotations.index import KeptTree, _spatial_index_build, spatial_index
from geosense.annotations.models import AnnotationRevision
from geosense.annotations.selectors import (
    annotations_nearest,
    annotations_overlapping,
    annotations_similar,
    annotations_within_distance,
)
from geosense.annotations.services import (
    annotations_restore,
    annotations_soft_delete,
    demo_seed,
)

pytestmark = pytest.mark.django_db


def same_as_fresh(index) -> None:
    fresh = _spatial_index_build(*AnnotationRevision.state())
    assert sorted(index.classes) == sorted(fresh.classes)
    for name, class_index in fresh.classes.items():
        ours = index.classes[name]
        assert ours.ids.tolist() == class_index.ids.tolist()
        assert np.allclose(ours.measures, class_index.measures)
        assert len(ours.tree) == len(class_index.ids)
    assert index.deleted.tolist() == fresh.deleted.tolist()


def test_deletions_and_restores_are_followed_without_a_rebuild(monkeypatch):
    demo_seed(annotations=1500, seed=0)
    before = spatial_index()
    trees = before.classes["tree"].ids[:5].tolist()
    pool = int(before.classes["pool"].ids[0])
    before.classes["pool"].vector_matrix("shape", 8)  # loaded, then followed

    def no_rebuild(*_args):
        raise AssertionError("the index was rebuilt")

    monkeypatch.setattr(index_module, "_spatial_index_build", no_rebuild)
    annotations_soft_delete(ids=[*trees, pool])
    after_delete = spatial_index()
    assert after_delete is not before
    assert not set(trees) & set(after_delete.classes["tree"].ids.tolist())
    assert pool not in after_delete.classes["pool"].ids
    assert all(hit.id != pool for hit in annotations_similar(samples=[(25, None)], k=50))
    pairs = annotations_within_distance(source="tree", target="house", distance_m=20)
    assert not set(trees) & set(pairs.source_ids.tolist())
    monkeypatch.undo()
    same_as_fresh(after_delete)

    monkeypatch.setattr(index_module, "_spatial_index_build", no_rebuild)
    annotations_restore(ids=trees[:2])
    after_restore = spatial_index()
    assert set(trees[:2]) <= set(after_restore.classes["tree"].ids.tolist())
    monkeypatch.undo()
    same_as_fresh(after_restore)
    fresh = _spatial_index_build(*AnnotationRevision.state())
    similar = [h.id for h in annotations_similar(samples=[(25, None)], k=20)]
    index_module._cached = fresh
    assert similar == [h.id for h in annotations_similar(samples=[(25, None)], k=20)]


def _answers():
    within = annotations_within_distance(source="tree", target="house", distance_m=20)
    return (
        within.source_ids.tolist(),
        within.target_ids.tolist(),
        annotations_overlapping(source="garage", target="house"),
        annotations_overlapping(source="house", target="house"),
        [(h.id, h.distance_m) for h in annotations_nearest(lat=0, lon=0, k=8)],
    )


def test_a_deletion_hides_annotations_in_their_class_tree_instead_of_building_it_again():
    demo_seed(annotations=1500, seed=0)
    before = spatial_index()
    houses = before.classes["house"]
    gone = houses.ids[::40].tolist()  # under a tenth: the tree is kept
    centre = before.projection
    annotations_soft_delete(ids=gone)

    after = spatial_index()
    kept = after.classes["house"].tree
    assert isinstance(kept, KeptTree) and kept.tree is houses.tree
    assert len(kept) == len(houses.ids) - len(gone)
    answers = _answers()
    assert not set(gone) & ({p.target_id for p in answers[2]} | set(answers[1]))
    nearest = annotations_nearest(lat=centre.lat, lon=centre.lon, k=30, category="house")
    assert not set(gone) & {h.id for h in nearest}
    index_module._cached = _spatial_index_build(*AnnotationRevision.state())
    assert answers == _answers()
    assert nearest == annotations_nearest(lat=centre.lat, lon=centre.lon, k=30, category="house")

    annotations_soft_delete(ids=houses.ids[1::9].tolist())  # more than a tenth: built again
    assert not isinstance(spatial_index().classes["house"].tree, KeptTree)
    same_as_fresh(spatial_index())


def test_a_write_of_content_rebuilds_the_index():
    demo_seed(annotations=300, seed=0)
    first = spatial_index()
    demo_seed(annotations=400, seed=0)
    second = spatial_index()
    assert second.generation != first.generation
    assert sum(second.counts().values()) == 400


@pytest.mark.django_db(transaction=True)
def test_a_warm_start_builds_the_index_and_the_tiles_shapes_before_the_first_query():
    from geosense.annotations.tiles import tiles_warm

    demo_seed(annotations=300, seed=0)
    index_module._cached = None

    index_module.spatial_index_warm(also=tiles_warm).join(timeout=60)

    built = index_module.spatial_index_cached()
    assert built is not None
    assert spatial_index() is built
    assert all("mercator" in c.derived for c in built.classes.values())


@pytest.mark.parametrize("dense_ids", [4, 0])
def test_areas_of_reads_live_areas_by_id_and_zero_for_anything_else(monkeypatch, dense_ids):
    """By an array indexed by id (ids dense) or by each class's sorted ids (sparse): the same."""
    monkeypatch.setattr(index_module, "DENSE_IDS", dense_ids)
    demo_seed(annotations=300, seed=0)
    house = spatial_index().classes["house"]
    gone = int(house.ids[0])
    annotations_soft_delete(ids=[gone])
    index = spatial_index()
    expected = {
        int(i): float(a)
        for c in index.classes.values()
        for i, a in zip(c.ids, c.measures[:, 0], strict=True)
    }
    ids = np.array([*list(expected)[::-1], gone, 0, -3, 10**9], dtype=np.int64)

    areas = index.areas_of(ids)

    assert areas.tolist() == [expected.get(int(i), 0.0) for i in ids]
    assert ("areas_by_id" in index.memo and index.memo["areas_by_id"] is not None) == bool(
        dense_ids
    )
    assert areas[: len(expected)].min() >= 0 and areas[-4:].tolist() == [0.0] * 4
