"""Reads of the cluster's database that the scale tests check what they see against, and the
one arrangement several of them share (a paid call waiting for its approval)."""

from tests.fakes.fake_openai import FakeOpenAI
from tests.scale.client import Api
from tests.scale.cluster import ScaleCluster


def first_pool(cluster: ScaleCluster) -> int:
    ((pool,),) = cluster.sql(
        "SELECT id FROM annotations_annotation WHERE category = 'pool' AND deleted_at IS NULL "
        "ORDER BY id LIMIT 1"
    )
    return pool


def balance(cluster: ScaleCluster) -> int:
    ((value,),) = cluster.sql(
        "SELECT balance FROM accounts_creditaccount a JOIN auth_user u ON u.id = a.user_id "
        "WHERE u.username = 'scale'"
    )
    return value


def stored_history(cluster: ScaleCluster, session: str) -> list[dict]:
    """The session's transcript as the model is fed it (tool calls and results only)."""
    history = []
    for role, calls, call_id in cluster.sql(
        "SELECT role, tool_calls, tool_call_id FROM chat_message "
        "WHERE session_id = %s AND role <> 'note' ORDER BY id",
        (session,),
    ):
        if role == "assistant":
            history.append({"role": role, "tool_calls": [{"id": c["id"]} for c in calls]})
        elif role == "tool":
            history.append({"role": role, "tool_call_id": call_id})
    return history


def paid_call_paused(
    cluster: ScaleCluster, api: Api, fake: FakeOpenAI, *, base: str, call_id: str
) -> tuple[str, dict]:
    """A new session on the process at `base` whose model called the paid similarity_search:
    the session and the call's pending approval (reason `credits`)."""
    session = api.session_create(base, allow_backend_tools=True)
    sample = {"samples": [{"id": first_pool(cluster)}]}
    fake.reply_tool_calls([(call_id, "similarity_search", sample)])
    return session, api.say(base, session, "pools like this one?").message["pending_approval"]
