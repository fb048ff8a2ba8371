"""The spatial_relation tool's stored artifact: the selectors' answer column by column (its
columns are numpy arrays until they are written), with the preview the model sees."""

import json

import numpy as np
import pytest

from chat.models import Artifact, ChatSession
from chat.services import artifact_save
from geosense.annotations import selectors
from geosense.annotations.services import demo_seed
from tools import builtin
from tools.registry import ToolContext

pytestmark = pytest.mark.django_db


@pytest.fixture
def stored(django_user_model):
    demo_seed(annotations=600, seed=0)
    session = ChatSession.objects.create(user=django_user_model.objects.create(username="u"))

    def save(*, kind, data, origin):
        return artifact_save(session_id=session.pk, kind=kind, data=data, origin=origin)

    def run(arguments):
        result = builtin.spatial_relation(ToolContext(artifact_save=save), arguments)
        json.dumps(result)  # the result goes to the model as JSON: plain values only
        return result, Artifact.objects.get(artifact_id=result["artifact_id"]).data

    return run


def test_within_distance_stores_the_pairs_their_metres_and_areas(stored):
    result, data = stored(
        {"relation": "within_distance", "source": "tree", "target": "house", "distance_m": 20}
    )

    within = selectors.annotations_within_distance(source="tree", target="house", distance_m=20)
    assert len(within.source_ids) > 20
    assert data["ids"] == within.source_ids.tolist()
    assert data["links"] == within.target_ids.tolist()
    assert data["linkValues"] == np.round(within.distances_m, 2).tolist()
    areas = selectors.annotation_areas(ids=within.source_ids)
    assert data["areas"] == np.round(areas, 2).tolist()
    assert (data["linkType"], data["distance_m"]) == ("distance", 20.0)
    assert result["count"] == len(within.source_ids)
    assert result["first"] == [
        {"id": i, "link": link, "value": v}
        for i, link, v in zip(data["ids"][:20], data["links"], data["linkValues"], strict=False)
    ]


def test_overlap_stores_the_pairs_and_their_shares(stored):
    result, data = stored({"relation": "overlap", "source": "garage", "target": "house"})

    pairs = selectors.annotations_overlapping(source="garage", target="house")
    assert pairs
    assert data["ids"] == [p.source_id for p in pairs]
    assert data["links"] == [p.target_id for p in pairs]
    assert data["linkValues"] == [round(p.share, 4) for p in pairs]
    assert data["linkType"] == "overlap" and result["count"] == len(pairs)
    assert result["first"][0] == {
        "id": pairs[0].source_id,
        "link": pairs[0].target_id,
        "value": round(pairs[0].share, 4),
    }


def test_nothing_found_stores_empty_columns(stored):
    result, data = stored(
        {"relation": "within_distance", "source": "pool", "target": "pool", "distance_m": 0.001}
    )

    assert (data["ids"], data["links"], data["linkValues"], data["areas"]) == ([], [], [], [])
    assert (result["count"], result["first"]) == (0, [])
