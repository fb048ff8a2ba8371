"""The chat page asks for every module of its script and for the map's tile JSON at once
(chat/templatetags/geosense_modules.py), instead of one level of imports after another."""

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from chat.templatetags.geosense_modules import IMPORT, module_graph

pytestmark = pytest.mark.django_db
STATIC = Path(settings.BASE_DIR) / "static"


@pytest.fixture
def page_html() -> str:
    client = Client()
    client.force_login(get_user_model().objects.create_user(username="ana", password="pw"))
    return client.get("/chat/").content.decode()


def test_every_module_the_page_imports_is_preloaded_at_once(page_html):
    head = page_html.split("</head>")[0]
    preloaded = set(re.findall(r'<link rel="modulepreload" href="/static/([^"]+)">', head))
    # Deep in the graph: page.js → chat.js → live-turn.js → turn-stream.js → sse.js.
    assert {
        "geosense/page.js",
        "geosense/map.js",
        "vendor/maplibre-gl/maplibre-gl.mjs",
    } <= preloaded
    assert {"vendor/sse/sse.js", "geosense/format.js", "geosense/map-style.js"} <= preloaded
    # … and nothing the page's script does not import (htmx is a classic script).
    assert "vendor/htmx/htmx.min.js" not in preloaded
    assert all((STATIC / path).is_file() for path in preloaded)
    # Every relative import of every preloaded module is preloaded too (the graph is closed).
    for path in preloaded:
        folder = (STATIC / path).parent
        for relative in IMPORT.findall((STATIC / path).read_text()):
            assert str((folder / relative).resolve().relative_to(STATIC)) in preloaded, (
                path,
                relative,
            )
    # MapLibre (the largest) is asked for first.
    first = re.search(r'<link rel="modulepreload" href="/static/([^"]+)">', head).group(1)
    assert first == "vendor/maplibre-gl/maplibre-gl.mjs"


def test_the_tile_json_is_preloaded_as_the_map_fetches_it(page_html):
    head = page_html.split("</head>")[0]
    assert '<link rel="preload" href="/tiles/annotations.json" as="fetch" crossorigin>' in head
    assert 'data-tiles-url="/tiles/annotations.json"' in page_html


def test_imports_are_read_across_lines_and_not_from_comments(tmp_path, settings):
    folder = tmp_path / "js"
    (folder / "sub").mkdir(parents=True)
    (folder / "entry.js").write_text(
        "// see import('./typed.js') for the shape\n"
        "import {\n  a,\n  b,\n} from './sub/a.js';\n"
        "import './side.js';\n"
        'export { c } from "./c.js";\n'
        "/** @type {import('./typed.js').T} */\n"
        "const lazy = () => import('./lazy.js');\n"
    )
    (folder / "sub" / "a.js").write_text("import { c } from '../c.js';\n")
    for name in ("side.js", "c.js", "typed.js", "lazy.js"):
        (folder / name).write_text("export const c = 1;\n")
    settings.STATICFILES_DIRS = [tmp_path]
    settings.DEBUG = True
    assert module_graph("js/entry.js") == ["js/entry.js", "js/sub/a.js", "js/side.js", "js/c.js"]
