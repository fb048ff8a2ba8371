"""Claims and socket registrations name the process holding them (chat/processes.py): a dead
process holds nothing, a restarted one frees what it held before, and the streamed text of a
turn is stored as it streams.

The kill-and-restart walk with real Daphne processes is in tests/multiprocess/test_recovery.py.
"""

import subprocess
import sys
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from chat import processes, services
from chat.models import ChatSession, ClientToolRegistration, Message, ServerProcess
from tests.chat.conftest import make_caller

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def heartbeats(settings, monkeypatch):
    """Heartbeats on, without this test process announcing itself or starting the thread."""
    monkeypatch.setattr(processes, "_started", True)
    settings.GEOSENSE_PROCESS_HEARTBEAT = 1.0
    settings.GEOSENSE_PROCESS_STALE = 4.0


def other_process(*, silent_for: float, host: str = "elsewhere", pid: int = 1) -> uuid.UUID:
    return ServerProcess.objects.create(
        id=uuid.uuid4(),
        host=host,
        pid=pid,
        heartbeat=timezone.now() - timedelta(seconds=silent_for),
    ).pk


def claimed_by(owner: uuid.UUID) -> ChatSession:
    session = make_caller(f"u{uuid.uuid4().hex[:8]}").session
    ChatSession.objects.filter(pk=session.pk).update(
        turn_state="running", turn_lease=timezone.now() + timedelta(seconds=120), turn_owner=owner
    )
    return session


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_claim_whose_process_stopped_heartbeating_is_taken_over(heartbeats):
    session = claimed_by(other_process(silent_for=30))
    services.session_claim(session_id=session.pk)
    session.refresh_from_db()
    assert (session.turn_state, session.turn_owner) == ("running", processes.PROCESS_ID)


def test_a_claim_of_a_process_that_heartbeats_stays_until_its_lease_ends(heartbeats):
    session = claimed_by(other_process(silent_for=0.5))
    with pytest.raises(services.SessionBusy):
        services.session_claim(session_id=session.pk)


def test_a_claim_of_a_process_whose_row_is_gone_is_taken_over(heartbeats):
    session = claimed_by(uuid.uuid4())
    services.session_claim(session_id=session.pk)


def test_without_heartbeats_a_claim_lasts_its_lease(settings):
    settings.GEOSENSE_PROCESS_HEARTBEAT = 0
    session = claimed_by(other_process(silent_for=30))
    with pytest.raises(services.SessionBusy):
        services.session_claim(session_id=session.pk)


def test_at_start_up_the_dead_processes_of_this_host_release_what_they_held(heartbeats):
    dead = other_process(silent_for=0.5, host=processes.HOST, pid=dead_pid())
    alive_elsewhere = other_process(silent_for=0.5)
    held, kept = claimed_by(dead), claimed_by(alive_elsewhere)
    for owner, channel in ((dead, "dead-socket"), (alive_elsewhere, "live-socket")):
        ClientToolRegistration.objects.create(
            channel_name=channel, session=held, tools=[], process=owner
        )

    assert processes.processes_dead_release() == 1

    held.refresh_from_db()
    kept.refresh_from_db()
    assert (held.turn_state, held.turn_owner) == ("idle", None)
    assert kept.turn_state == "running"
    assert list(ClientToolRegistration.objects.values_list("channel_name", flat=True)) == [
        "live-socket"
    ]
    assert list(ServerProcess.objects.values_list("pk", flat=True)) == [alive_elsewhere]


def test_a_process_that_exits_releases_its_claims_and_sockets(heartbeats):
    session = make_caller("carol").session
    services.session_claim(session_id=session.pk)
    ClientToolRegistration.objects.create(
        channel_name="mine", session=session, tools=[], process=processes.PROCESS_ID
    )
    processes._release([processes.PROCESS_ID])
    session.refresh_from_db()
    assert session.turn_state == "idle"
    assert not ClientToolRegistration.objects.exists()


def test_a_release_after_a_take_over_leaves_the_new_turn_alone(heartbeats):
    session = claimed_by(other_process(silent_for=0.5))
    services.session_release(session_id=session.pk)
    session.refresh_from_db()
    assert session.turn_state == "running"


def test_the_draft_of_a_stream_is_completed_by_its_message():
    session = make_caller("dave").session
    draft = services.message_draft_save(session_id=session.pk, turn=1, draft_id=None, content="Th")
    assert (
        services.message_draft_save(session_id=session.pk, turn=1, draft_id=draft, content="The an")
        == draft
    )
    assert Message.objects.get(pk=draft).cut_off
    services.message_store(
        session_id=session.pk, turn=1, role="assistant", content="The answer.", draft_id=draft
    )
    # A save that arrives late never turns a completed message back into a draft.
    services.message_draft_save(session_id=session.pk, turn=1, draft_id=draft, content="The a")
    message = Message.objects.get(session=session)
    assert (message.content, message.cut_off) == ("The answer.", False)
