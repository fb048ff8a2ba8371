"""Approval cards on the chat page: approve, reject, reload while pending, one decision only."""

import json

from playwright.sync_api import expect

from tests.browser.helpers import map_rendered_ids, screenshot
from tests.browser.test_chat_basics import ask, last_answer, new_session

ARTIFACTS = "SELECT artifact_id, data FROM chat_artifact WHERE session_id = ? ORDER BY id"
DELETED = "SELECT deleted_at FROM annotations_annotation WHERE id = ?"


def approval_card(page):
    return page.get_by_test_id("approval-card").last


def test_approving_backend_access_highlights_the_found_trees_on_the_map(
    logged_in_page, daphne_server, page_errors
):
    page = logged_in_page
    session_id = new_session(page)

    ask(page, "show trees within 20 m of a house")
    card = approval_card(page)
    expect(card).to_contain_text("First use of the server's tools in this conversation")
    expect(card.get_by_role("button", name="Approve")).to_be_enabled()
    expect(page.get_by_label("Allow backend tools")).not_to_be_checked()
    screenshot(page, "chat-approval-pending")
    card.get_by_role("button", name="Approve").click()

    expect(last_answer(page)).to_contain_text("within")
    expect(card.get_by_test_id("approval-outcome")).to_have_text("Approved")
    page.wait_for_function("window.geosenseMap.highlightedIds().length > 0")
    ((artifact_id, data),) = daphne_server.sql(ARTIFACTS, (session_id.replace("-", ""),))
    stored = page.request.get(f"/api/sessions/{session_id}/artifacts/{artifact_id}").json()
    highlighted = page.evaluate("window.geosenseMap.highlightedIds()")
    drawn = map_rendered_ids(page, "highlighted")
    assert highlighted == sorted(stored["data"]["ids"]) == sorted(json.loads(data)["ids"])
    assert drawn == highlighted
    expect(page.get_by_label("Allow backend tools")).to_be_checked()
    log = page.get_by_test_id("activity-log")
    expect(log).to_have_count(1)
    log.locator("summary").click()
    expect(log).to_contain_text("Trees within 20 m of a house — done")
    screenshot(page, "chat-highlight")

    page.reload()
    expect(last_answer(page)).to_contain_text("within")
    expect(page.get_by_test_id("activity-log")).to_have_count(0)
    expect(approval_card(page).get_by_test_id("approval-outcome")).to_have_text("Approved")
    assert page_errors == []


def test_rejecting_a_deletion_keeps_the_annotation(logged_in_page, daphne_server):
    page = logged_in_page
    new_session(page)

    ask(page, "delete annotation 12")
    card = approval_card(page)
    expect(card).to_contain_text("Deletes annotations")
    card.get_by_role("button", name="Reject").click()

    expect(card.get_by_test_id("approval-outcome")).to_have_text("Rejected")
    expect(last_answer(page)).to_contain_text("I did not delete")
    assert daphne_server.sql(DELETED, (12,)) == [(None,)]


def test_a_pending_approval_survives_a_reload_and_is_approved_after_it(
    logged_in_page, daphne_server
):
    page = logged_in_page
    new_session(page)
    ask(page, "delete annotation 13")
    expect(approval_card(page).get_by_role("button", name="Approve")).to_be_visible()

    page.reload()
    page.wait_for_function("window.geosenseSocketReady === true")
    card = approval_card(page)
    expect(card).to_have_attribute("data-status", "pending")
    card.get_by_role("button", name="Approve").click()

    expect(card.get_by_test_id("approval-outcome")).to_have_text("Approved")
    expect(last_answer(page)).to_contain_text("Deleted")
    assert daphne_server.sql(DELETED, (13,)) != [(None,)]


def test_a_double_click_on_approve_sends_one_decision(logged_in_page):
    page = logged_in_page
    new_session(page)
    ask(page, "delete annotation 14")
    card = approval_card(page)
    expect(card.get_by_role("button", name="Approve")).to_be_enabled()
    resumes = []
    page.on(
        "request", lambda r: resumes.append(r.url) if "/message/resume/stream" in r.url else None
    )

    card.get_by_role("button", name="Approve").dblclick()

    expect(card.get_by_test_id("approval-outcome")).to_have_text("Approved")
    assert len(resumes) == 1
