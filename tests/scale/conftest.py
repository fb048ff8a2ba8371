"""Fixtures of the scale tests: one PostgreSQL + PostGIS cluster, one Redis and two Daphne
processes for the whole test session (see tests/scale/cluster.py).

Every test in this folder gets the `scale` marker. Without PostgreSQL, PostGIS, redis-server or
nginx they are skipped with the reason, or fail when `GEOSENSE_REQUIRE_SCALE=1` (CI). A failing
test's report ends with the tail of each Daphne process's log.
"""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.fake_openai import FakeOpenAI
from tests.scale.client import Api
from tests.scale.cluster import ScaleCluster, scale_missing

HERE = Path(__file__).resolve().parent
# Short enough that the crash test waits seconds, not the production default's two minutes.
TURN_LEASE_SECONDS = 8


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.scale)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    cluster = item.funcargs.get("cluster") if hasattr(item, "funcargs") else None
    if report.failed and isinstance(cluster, ScaleCluster):
        report.sections.append(("Daphne logs", cluster.logs()))
    return report


def scale_required_or_skip() -> None:
    missing = scale_missing()
    if missing:
        reason = "the scale tests need " + ", ".join(missing)
        if os.environ.get("GEOSENSE_REQUIRE_SCALE") == "1":
            pytest.fail(f"{reason}, and GEOSENSE_REQUIRE_SCALE=1")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def scale_cluster(
    tmp_path_factory: pytest.TempPathFactory, fake_llm_server: FakeOpenAI
) -> Iterator[ScaleCluster]:
    """Two Daphnes (A and B) on PostgreSQL + PostGIS and Redis, with the openai agent pointed
    at the session's fake model server; production settings (DEBUG off)."""
    scale_required_or_skip()
    cluster = ScaleCluster(
        workdir=tmp_path_factory.mktemp("scale"),
        processes=2,
        extra_env={
            "DEBUG": "0",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "GEOSENSE_LLM_BASE_URL": fake_llm_server.base_url,
            "GEOSENSE_LLM_MODEL": "fake-model",
            "GEOSENSE_TURN_LEASE": str(TURN_LEASE_SECONDS),
        },
    ).start()
    yield cluster
    cluster.stop()


USER_SETUP = """
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from geosense.accounts.services import api_token_create, credit_set
user = get_user_model().objects.create_user("scale")
credit_set(user=user, balance=1000)
user.user_permissions.add(Permission.objects.get(codename="delete_annotation"))
print(api_token_create(user=user))
"""


@pytest.fixture(scope="session")
def scale_api(scale_cluster: ScaleCluster) -> Api:
    """The HTTP API of a user with 1,000 credits who curates the annotations (may delete),
    usable against any process of the cluster."""
    return Api(token=scale_cluster.shell(USER_SETUP).strip().splitlines()[-1])


@pytest.fixture
def cluster(scale_cluster: ScaleCluster, fake_llm: FakeOpenAI) -> Iterator[ScaleCluster]:
    """The cluster with the fake model reset and every process running."""
    for daphne in scale_cluster.daphnes:
        if not daphne.alive:  # a test killed it
            daphne.start()
    yield scale_cluster
