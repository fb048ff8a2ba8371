"""Backend tool calls that wait for the user: the policy, the pause, resume, set aside, credits."""

import asyncio
import json

import pytest

from chat.models import Approval, ChatSession, Message
from geosense.accounts.models import CreditCharge
from geosense.accounts.services import credit_balance, credit_set
from geosense.annotations.models import Annotation
from tests.chat.conftest import Caller, make_caller
from tests.chat.helpers import history_is_valid, post_stream, stored_history_is_valid

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

SIMILAR = ("similarity_search", {"samples": [{"id": 1}], "k": 5})


@pytest.fixture(autouse=True)
def _first_annotation_is_1(request):
    """Tests name annotation 1; make sure it exists whatever ids earlier tests used."""
    if "neighbourhood" in request.fixturenames:
        request.getfixturevalue("neighbourhood")
        first = (
            Annotation.objects.filter(category="pool").order_by("id").first()
            or Annotation.objects.order_by("id").first()
        )
        if first.pk != 1:
            Annotation.all_objects.filter(pk=1).delete()
            Annotation.all_objects.filter(pk=first.pk).update(id=1)


async def _pause(client, caller, fake, call, *, text="please"):
    fake.reply_tool_calls([("call_1", *call)])
    out = await post_stream(
        client, caller.url("/message/stream"), {"text": text}, token=caller.token
    )
    return out, out.message["pending_approval"]


async def _resume(client, caller, approval_id, decision):
    return await post_stream(
        client,
        caller.url("/message/resume/stream"),
        {"approval": approval_id, "decision": decision},
        token=caller.token,
    )


async def _notes(caller) -> list[str]:
    """The notes of the caller's session: what the transcript shows the person after a reload."""
    notes = Message.objects.filter(session=caller.session, role=Message.Role.NOTE)
    return [note.content async for note in notes.order_by("id")]


async def _live_id() -> int:
    return (await Annotation.objects.order_by("id").afirst()).pk


@pytest.mark.parametrize(
    ("trusted", "call", "reasons", "cost"),
    [
        (False, ("list_classes", {}), ["backend_access"], 0),
        (True, SIMILAR, ["credits"], 5),
        (True, ("delete_annotations", {"ids": [1]}), ["destructive"], 0),
        (False, SIMILAR, ["backend_access", "credits"], 5),
        (False, ("delete_annotations", {"ids": [1]}), ["backend_access", "destructive"], 0),
    ],
)
async def test_each_reason_alone_and_combined_pauses_the_turn(
    client, openai_agent, neighbourhood, trusted, call, reasons, cost
):
    caller = await asyncio.to_thread(
        make_caller, "carol", allow_backend_tools=trusted, curator=True
    )
    out, pending = await _pause(client, caller, openai_agent, call)
    assert out.names()[-2:] == ["message", "turn_end"]
    assert "backend_tool_call" not in out.names()
    assert pending["tool"] == call[0] and pending["arguments"] == call[1]
    assert pending["reasons"] == reasons and pending["cost_credits"] == cost
    assert pending["summary"]
    assert len(openai_agent.requests) == 1  # nothing ran, the model was not asked again
    stored = json.loads(
        (
            await client.get(caller.url(), headers={"Authorization": f"Bearer {caller.token}"})
        ).content
    )
    assert stored["messages"][-1]["pending_approval"]["id"] == pending["id"]


async def test_a_call_needing_no_approval_runs_at_once(
    client, trusted_caller, openai_agent, neighbourhood
):
    openai_agent.reply_tool_calls([("c1", "list_classes", {})])
    openai_agent.reply_text("ok")
    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "x"}, token=trusted_caller.token
    )
    assert out.message["pending_approval"] is None
    assert not await Approval.objects.aexists()


async def test_approving_runs_the_call_charges_once_and_continues(
    client, trusted_caller, openai_agent, neighbourhood
):
    _, pending = await _pause(client, trusted_caller, openai_agent, SIMILAR)
    openai_agent.reply_text("Here are similar ones.")
    out = await _resume(client, trusted_caller, pending["id"], "approve")
    assert out.names()[0] == "turn_start"
    (call,) = out.of("backend_tool_call")
    assert call["name"] == "similarity_search" and call["ok"] is True
    assert out.message["content"] == "Here are similar ones."
    assert await asyncio.to_thread(credit_balance, user=trusted_caller.user) == 95
    charge = await CreditCharge.objects.aget()
    assert (charge.amount, charge.tool_call_id, charge.tool_name) == (
        5,
        "call_1",
        "similarity_search",
    )
    approval = await Approval.objects.aget(pk=pending["id"])
    assert approval.status == "approved" and approval.decided_by_id == trusted_caller.user.pk
    fed = openai_agent.requests[-1]["messages"]
    assert history_is_valid(fed)
    assert [m["tool_call_id"] for m in fed if m["role"] == "tool"] == ["call_1"]


async def test_a_call_id_reused_in_other_sessions_and_by_other_users_is_charged_each_time(
    client, trusted_caller, openai_agent, neighbourhood
):
    """Servers that send no id make every call `call_0`; the charge is keyed by the stored
    call (session and id), so a paid call never runs free because another one had its id."""
    again = Caller(
        user=trusted_caller.user,
        token=trusted_caller.token,
        session=await ChatSession.objects.acreate(
            user=trusted_caller.user, allow_backend_tools=True
        ),
    )
    mallory = await asyncio.to_thread(make_caller, "mallory", credits=10, allow_backend_tools=True)
    for who in (trusted_caller, again, mallory):
        openai_agent.reply_tool_calls([("call_0", *SIMILAR)])
        out = await post_stream(client, who.url("/message/stream"), {"text": "x"}, token=who.token)
        openai_agent.reply_text("Found them.")
        await _resume(client, who, out.message["pending_approval"]["id"], "approve")
    assert await asyncio.to_thread(credit_balance, user=trusted_caller.user) == 90
    assert await asyncio.to_thread(credit_balance, user=mallory.user) == 5
    charges = [
        (c.user_id, c.session_id, c.tool_call_id) async for c in CreditCharge.objects.order_by("id")
    ]
    assert charges == [
        (trusted_caller.user.pk, str(trusted_caller.session.pk), "call_0"),
        (trusted_caller.user.pk, str(again.session.pk), "call_0"),
        (mallory.user.pk, str(mallory.session.pk), "call_0"),
    ]


async def test_approving_backend_access_turns_the_toggle_on(
    client, caller, openai_agent, neighbourhood
):
    _, pending = await _pause(client, caller, openai_agent, ("list_classes", {}))
    openai_agent.reply_text("counted")
    await _resume(client, caller, pending["id"], "approve")
    assert (await ChatSession.objects.aget(pk=caller.session.pk)).allow_backend_tools is True


async def test_rejecting_tells_the_model_and_leaves_the_annotation_in_place(
    client, trusted_caller, openai_agent, neighbourhood
):
    target = await _live_id()
    _, pending = await _pause(
        client, trusted_caller, openai_agent, ("delete_annotations", {"ids": [target]})
    )
    openai_agent.reply_text("Kept it.")
    out = await _resume(client, trusted_caller, pending["id"], "reject")
    (call,) = out.of("backend_tool_call")
    assert call["ok"] is False and "declined" in call["error"]
    assert await Annotation.objects.filter(pk=target).aexists()
    fed = openai_agent.requests[-1]["messages"]
    assert history_is_valid(fed) and "declined" in fed[-1]["content"]
    assert (await Approval.objects.aget(pk=pending["id"])).status == "rejected"
    assert await asyncio.to_thread(credit_balance, user=trusted_caller.user) == 100


def _restore_in_admin(annotation_id: int) -> int:
    from django.contrib.auth import get_user_model
    from django.test import Client

    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    browser = Client()
    browser.force_login(admin)
    response = browser.post(
        "/admin/annotations/annotation/", {"action": "restore", "_selected_action": [annotation_id]}
    )
    return response.status_code


async def test_an_approved_deletion_is_soft_and_restored_in_the_admin(
    client, trusted_caller, openai_agent, neighbourhood
):
    target = await _live_id()
    _, pending = await _pause(
        client, trusted_caller, openai_agent, ("delete_annotations", {"ids": [target]})
    )
    openai_agent.reply_text("Deleted.")
    await _resume(client, trusted_caller, pending["id"], "approve")
    assert not await Annotation.objects.filter(pk=target).aexists()
    assert await Annotation.all_objects.filter(pk=target, deleted_at__isnull=False).aexists()
    assert await asyncio.to_thread(_restore_in_admin, target) == 302
    assert await Annotation.objects.filter(pk=target).aexists()


async def test_a_resumed_turn_can_pause_again(client, trusted_caller, openai_agent, neighbourhood):
    target = await _live_id()
    _, first = await _pause(client, trusted_caller, openai_agent, SIMILAR)
    openai_agent.reply_tool_calls([("call_2", "delete_annotations", {"ids": [target]})])
    out = await _resume(client, trusted_caller, first["id"], "approve")
    second = out.message["pending_approval"]
    assert second["tool"] == "delete_annotations" and second["id"] != first["id"]
    openai_agent.reply_text("All done.")
    final = await _resume(client, trusted_caller, second["id"], "approve")
    assert final.message["content"] == "All done."
    assert history_is_valid(openai_agent.requests[-1]["messages"])


async def test_the_remaining_calls_of_a_step_wait_behind_the_approval(
    client, trusted_caller, openai_agent, neighbourhood
):
    openai_agent.reply_tool_calls([("c1", *SIMILAR), ("c2", "list_classes", {})])
    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "x"}, token=trusted_caller.token
    )
    assert out.message["pending_approval"]["tool"] == "similarity_search"
    assert not await Message.objects.filter(role="tool").aexists()
    openai_agent.reply_text("Both done.")
    resumed = await _resume(
        client, trusted_caller, out.message["pending_approval"]["id"], "approve"
    )
    assert [c["call_id"] for c in resumed.of("backend_tool_call")] == ["c1", "c2"]
    assert history_is_valid(openai_agent.requests[-1]["messages"])


async def test_a_new_message_sets_the_approval_aside(
    client, trusted_caller, openai_agent, neighbourhood
):
    _, pending = await _pause(client, trusted_caller, openai_agent, SIMILAR)
    openai_agent.reply_text("Sure, something else.")
    out = await post_stream(
        client,
        trusted_caller.url("/message/stream"),
        {"text": "never mind"},
        token=trusted_caller.token,
    )
    assert out.message["content"] == "Sure, something else."
    assert (await Approval.objects.aget(pk=pending["id"])).status == "set_aside"
    fed = openai_agent.requests[-1]["messages"]
    assert history_is_valid(fed)
    assert "set aside" in next(m for m in fed if m["role"] == "tool")["content"]
    late = await _resume(client, trusted_caller, pending["id"], "approve")
    assert late.status == 409
    assert await asyncio.to_thread(credit_balance, user=trusted_caller.user) == 100


async def test_resume_reads_only_the_database(client, trusted_caller, openai_agent, neighbourhood):
    """A fresh engine (another process after a restart) resumes from the stored rows alone."""
    from django.db import connections

    from chat import turns

    _, pending = await _pause(client, trusted_caller, openai_agent, SIMILAR)
    await asyncio.to_thread(connections.close_all)
    assert not turns._running
    openai_agent.reply_text("Resumed after a restart.")
    out = await _resume(client, trusted_caller, pending["id"], "approve")
    assert out.message["content"] == "Resumed after a restart."


async def test_deciding_refuses_unknown_decided_foreign_and_stale_approvals(
    client, trusted_caller, openai_agent, neighbourhood
):
    _, first = await _pause(client, trusted_caller, openai_agent, SIMILAR)
    assert (await _resume(client, trusted_caller, 999999, "approve")).status == 404
    bad = await post_stream(
        client,
        trusted_caller.url("/message/resume/stream"),
        {"approval": first["id"], "decision": "maybe"},
        token=trusted_caller.token,
    )
    assert bad.status == 400
    other = await asyncio.to_thread(make_caller, "oscar", allow_backend_tools=True)
    foreign = await post_stream(
        client,
        other.url("/message/resume/stream"),
        {"approval": first["id"], "decision": "approve"},
        token=other.token,
    )
    assert foreign.status == 404
    # a second, newer approval makes the first one stale (not the session's latest)
    await Approval.objects.filter(pk=first["id"]).aupdate(status="pending")
    message = await Message.objects.filter(role="assistant").alast()
    newer = await Approval.objects.acreate(
        session=trusted_caller.session,
        message=message,
        tool_call_id="other",
        tool_name="list_classes",
    )
    stale = await _resume(client, trusted_caller, first["id"], "approve")
    assert stale.status == 409 and "latest" in stale.body["error"]
    await newer.adelete()
    openai_agent.reply_text("ok")
    assert (await _resume(client, trusted_caller, first["id"], "reject")).status == 200
    again = await _resume(client, trusted_caller, first["id"], "approve")
    assert again.status == 409 and "already rejected" in again.body["error"]


async def test_a_call_the_balance_cannot_cover_is_refused_before_it_runs(
    client, trusted_caller, openai_agent, neighbourhood
):
    await asyncio.to_thread(credit_set, user=trusted_caller.user, balance=3)
    openai_agent.reply_tool_calls([("c1", *SIMILAR)])
    openai_agent.reply_text("You do not have enough credits.")
    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "x"}, token=trusted_caller.token
    )
    assert not await Approval.objects.aexists()
    (error,) = out.of("error")
    assert error["message"] == (
        "Not enough credits for “Search for similar annotations”: it costs 5 credits and you "
        "have 3 credits."
    )
    (call,) = out.of("backend_tool_call")
    assert call["ok"] is False and call["problem"] == error["message"]
    assert "balance is 3" in call["error"]  # the model reads the precise reason
    assert out.message["content"] == "You do not have enough credits."
    assert await asyncio.to_thread(credit_balance, user=trusted_caller.user) == 3
    assert await _notes(trusted_caller) == [error["message"]]  # kept for a reload


async def test_a_balance_spent_while_the_approval_waited_refuses_on_approve(
    client, trusted_caller, openai_agent, neighbourhood
):
    _, pending = await _pause(client, trusted_caller, openai_agent, SIMILAR)
    await asyncio.to_thread(credit_set, user=trusted_caller.user, balance=2)
    openai_agent.reply_text("Not enough credits, sorry.")
    out = await _resume(client, trusted_caller, pending["id"], "approve")
    assert out.of("backend_tool_call")[0]["ok"] is False
    assert "not enough credits" in out.of("error")[0]["message"].lower()
    assert await _notes(trusted_caller) == [out.of("error")[0]["message"]]
    assert await asyncio.to_thread(credit_balance, user=trusted_caller.user) == 2
    assert not await CreditCharge.objects.aexists()
    assert await asyncio.to_thread(stored_history_is_valid, trusted_caller.session.pk)


async def test_a_rejection_stores_the_calls_result_with_the_decision(
    client, trusted_caller, openai_agent, neighbourhood
):
    """If the process dies right after the decision, the history is still valid to send."""
    from chat.approvals import approval_decide

    _, pending = await _pause(client, trusted_caller, openai_agent, SIMILAR)
    await asyncio.to_thread(
        approval_decide,
        session_id=trusted_caller.session.pk,
        approval_id=pending["id"],
        decision="reject",
        user=trusted_caller.user,
    )
    result = await Message.objects.aget(role="tool", tool_call_id="call_1")
    assert result.is_error and "declined" in result.content
    assert await asyncio.to_thread(stored_history_is_valid, trusted_caller.session.pk)


async def test_an_ordinary_users_deletion_is_refused_before_any_approval_card(
    client, openai_agent, neighbourhood
):
    """The annotations are one shared dataset: only its curators may delete from it."""
    caller = await asyncio.to_thread(make_caller, "olive", allow_backend_tools=True)
    target = await _live_id()
    openai_agent.reply_tool_calls([("call_1", "delete_annotations", {"ids": [target]})])
    openai_agent.reply_text("I may not delete it.")
    out = await post_stream(
        client, caller.url("/message/stream"), {"text": "x"}, token=caller.token
    )
    assert not await Approval.objects.aexists()
    assert out.message["pending_approval"] is None
    (error,) = out.of("error")
    assert error["message"].startswith("You may not use “Delete annotations”")
    assert "delete_annotation" not in error["message"]  # the code names are the model's
    (call,) = out.of("backend_tool_call")
    assert call["ok"] is False and "Refused before running" in call["error"]
    assert "annotations.delete_annotation" in call["error"] and call["problem"] == error["message"]
    assert await Annotation.objects.filter(pk=target).aexists()


async def test_a_permission_withdrawn_while_the_approval_waited_refuses_on_approve(
    client, trusted_caller, openai_agent, neighbourhood
):
    target = await _live_id()
    _, pending = await _pause(
        client, trusted_caller, openai_agent, ("delete_annotations", {"ids": [target]})
    )
    await asyncio.to_thread(trusted_caller.user.user_permissions.clear)
    openai_agent.reply_text("Not allowed.")
    out = await _resume(client, trusted_caller, pending["id"], "approve")
    assert "You may not use “Delete annotations”" in out.of("error")[0]["message"]
    assert await Annotation.objects.filter(pk=target).aexists()
