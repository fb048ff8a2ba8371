"""`/healthz` on PostgreSQL + Redis: each process checks the database, a round trip through
Redis and the migrations; a process that cannot reach its database answers 503."""

import json
import urllib.error
import urllib.request

from tests.scale.cluster import DaphneProcess


def health(base: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(base + "/healthz", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_every_process_is_healthy_on_postgresql_and_redis(cluster):
    for daphne in cluster.daphnes:
        status, body = health(daphne.url)
        assert status == 200, body
        assert body["checks"]["database"]["vendor"] == "postgresql"
        assert body["checks"]["channel_layer"]["backend"] == "RedisPubSubChannelLayer"
        assert body["checks"]["migrations"]["unapplied"] == []


def test_a_process_that_cannot_reach_its_database_answers_503(cluster, tmp_path):
    env = {**cluster.env, "DATABASE_URL": cluster.postgres.url + "_missing"}
    lost = DaphneProcess(name="lost", env=env, log_path=tmp_path / "lost.log").start()
    try:
        status, body = health(lost.url)
    finally:
        lost.stop()

    assert status == 503
    assert body["status"] == "failing"
    assert body["checks"]["database"] == {
        "ok": False,
        "ms": body["checks"]["database"]["ms"],
        "error": "OperationalError",
    }
    assert body["checks"]["migrations"]["ok"] is False
    assert body["checks"]["channel_layer"]["ok"] is True
