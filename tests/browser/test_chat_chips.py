"""Inline chips in answers focus the map on the annotation they name."""

from playwright.sync_api import expect

from tests.browser.test_chat_basics import ask, last_answer, new_session


def test_a_ref_chip_focuses_the_map_on_its_annotation(logged_in_page, daphne_server):
    page = logged_in_page
    new_session(page)
    page.get_by_label("Allow backend tools").check()
    ask(page, "which is the largest house?")
    chip = last_answer(page).locator("button.chip.ref").first
    expect(chip).to_be_visible()
    annotation_id = int(chip.get_attribute("data-annotation-id"))
    ((largest,),) = daphne_server.sql(
        "SELECT id FROM annotations_annotation WHERE category = 'house' AND deleted_at IS NULL"
        " ORDER BY area_m2 DESC, id LIMIT 1"
    )
    assert annotation_id == largest

    page.evaluate("window.geosenseMap.focus([])")  # start from the whole map
    before = page.evaluate("window.geosenseMap.view()")
    chip.click()
    page.wait_for_function("(zoom) => window.geosenseMap.view().zoom > zoom", arg=before["zoom"])
    page.evaluate("window.geosenseMap.idle()")
    point = page.evaluate("(id) => window.geosenseMap.screenPoint(id)", annotation_id)
    (x, y) = (point["x"], point["y"])
    size = page.evaluate(
        "(() => { const r = document.querySelector('#map').getBoundingClientRect(); return [r.width, r.height]; })()"
    )
    assert 0 <= x <= size[0] and 0 <= y <= size[1]  # the house is on screen
