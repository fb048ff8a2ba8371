"""Take the README's screenshots of a running GeoSense at phone, tablet and desktop widths.

    make run                                   # in another terminal, on a freshly seeded demo
    .venv/bin/python scripts/screenshots.py [--url http://127.0.0.1:8000] [--out docs/screenshots]

Each width logs in as demo/demo (which opens a new conversation), asks for the showcase query
("trees within 20 m of a house"), approves the first use of the server's tools, then waits for
the answer and the highlight on the map. The phone shows the map (with the highlight) and the chat in two
pictures, the wider screens one each. Run by hand, never by the tests; Debian's Chromium.
"""

import argparse
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-sync"]
QUERY = "show trees within 20 m of a house"
# The desktop first: its list then shows one conversation, not the other widths' copies.
WIDTHS = {"desktop": (1400, 900), "tablet": (1000, 800), "phone": (390, 844)}
# Closer in, around the tree nearest the centre that the query left out (in a park or a wooded
# lot), so the picture shows which trees are near a house and which are not.
ZOOM_TO_CONTRAST = """async (levels) => {
  const gs = window.geosenseMap, map = gs.map;
  const highlighted = new Set(gs.highlightedIds());
  const b = map.getBounds();
  const bbox = [b.getWest(), b.getSouth(), b.getEast(), b.getNorth()].join(',');
  const trees = (await (await fetch(`/api/annotations?bbox=${bbox}&class=tree`)).json()).features;
  const first = (c) => (typeof c[0] === 'number' ? c : first(c[0]));
  const quiet = trees.filter((f) => !highlighted.has(Number(f.id))).map((f) => first(f.geometry.coordinates));
  if (!quiet.length) return;
  const { lng, lat } = map.getCenter();
  const away = (p) => (p[0] - lng) ** 2 + (p[1] - lat) ** 2;
  quiet.sort((p, q) => away(p) - away(q));
  map.jumpTo({ center: quiet[0], zoom: map.getZoom() + levels });
}"""


def shoot(browser, url: str, out: Path, name: str, size: tuple[int, int]) -> list[Path]:
    width, height = size
    context = browser.new_context(
        base_url=url,
        viewport={"width": width, "height": height},
        device_scale_factor=1,
        bypass_csp=True,  # Playwright's wait_for_function evaluates with eval
    )
    page = context.new_page()
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill("demo")
    page.get_by_label("Password").fill("demo")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/chat/")  # the login opens a new conversation
    page.get_by_label("Your message").fill(QUERY)
    page.get_by_label("Your message").press("Enter")
    page.wait_for_url("**/chat/*-*/")
    card = page.get_by_test_id("approval-card").last
    card.get_by_role("button", name="Approve").click()
    answer = page.locator(".message.assistant[data-message-id]").last
    expect(answer).to_contain_text("within", timeout=30_000)
    page.wait_for_function("window.geosenseMap.highlightedIds().length > 0", timeout=30_000)
    page.wait_for_timeout(1000)  # the fit's camera move
    page.evaluate(ZOOM_TO_CONTRAST, 2 if name == "phone" else 1.5)
    page.evaluate("window.geosenseMap.idle && window.geosenseMap.idle()")
    page.wait_for_timeout(1500)  # the tiles settle
    taken = []
    if name == "phone":
        taken.append(out / "phone-chat.png")
        page.screenshot(path=str(taken[-1]))
        page.get_by_role("button", name="Map", exact=True).click()
        page.wait_for_timeout(1000)
        taken.append(out / "phone-map.png")
    else:
        taken.append(out / f"{name}.png")
    page.screenshot(path=str(taken[-1]))
    context.close()
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            for name, size in WIDTHS.items():
                for path in shoot(browser, options.url, options.out, name, size):
                    print(path)
        finally:
            browser.close()


if __name__ == "__main__":
    main()
