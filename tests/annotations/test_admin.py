import pytest
from django.contrib.auth import get_user_model

from geosense.annotations.models import Annotation
from geosense.annotations.selectors import annotation_counts
from geosense.annotations.services import annotation_create, annotations_soft_delete

from .shapes import point

pytestmark = pytest.mark.django_db
CHANGELIST = "/admin/annotations/annotation/"


@pytest.fixture
def admin_client(client):
    client.force_login(
        get_user_model().objects.create_superuser(username="root", password="pw", email="r@x.y")
    )
    return client


def test_deleted_annotations_are_listed_in_the_admin_and_restored_by_its_action(admin_client):
    tree = annotation_create(category="tree", geometry=point(1, 1))
    annotations_soft_delete(ids=[tree.id])

    listing = admin_client.get(CHANGELIST, {"state": "deleted"})
    response = admin_client.post(CHANGELIST, {"action": "restore", "_selected_action": [tree.id]})

    assert f"/admin/annotations/annotation/{tree.id}/change/" in listing.content.decode()
    assert response.status_code == 302
    assert annotation_counts() == {"tree": 1}


def test_the_admin_soft_deletes_instead_of_deleting(admin_client):
    tree = annotation_create(category="tree", geometry=point(1, 1))

    admin_client.post(CHANGELIST, {"action": "soft_delete", "_selected_action": [tree.id]})

    assert Annotation.all_objects.get(pk=tree.id).is_deleted
    admin_client.post(
        CHANGELIST, {"action": "delete_selected", "_selected_action": [tree.id], "post": "yes"}
    )
    assert Annotation.all_objects.filter(pk=tree.id).exists()


def test_the_admin_finds_an_annotation_by_id_and_filters_by_class(admin_client):
    tree = annotation_create(category="tree", geometry=point(1, 1))
    pool = annotation_create(category="pool", geometry=point(1, 2))

    by_id = admin_client.get(CHANGELIST, {"q": str(pool.id)}).content.decode()
    by_class = admin_client.get(CHANGELIST, {"category": "tree"}).content.decode()

    assert (
        f"/annotation/{pool.id}/change/" in by_id and f"/annotation/{tree.id}/change/" not in by_id
    )
    assert (
        f"/annotation/{tree.id}/change/" in by_class
        and f"/annotation/{pool.id}/change/" not in by_class
    )


@pytest.mark.parametrize(
    "path",
    [
        "/admin/accounts/creditaccount/",
        "/admin/accounts/creditcharge/",
        "/admin/accounts/apitoken/",
    ],
)
def test_credit_balances_ledger_and_tokens_have_admin_pages(admin_client, path):
    assert admin_client.get(path).status_code == 200
