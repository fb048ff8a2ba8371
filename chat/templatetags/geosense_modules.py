"""`{% module_preloads "geosense/page.js" %}`: a `<link rel="modulepreload">` for every ES module
an entry script imports, directly or not.

Without them the browser discovers the module graph one level at a time (page.js, then
chat.js and map.js, then what they import …): four round trips and parses in a row before
any module runs, ~0.4 s of the map's first draw on a loaded machine. With them every module
is asked for while the head is parsed. The graph is read from the files themselves (their
static `import … from './x.js'` lines), so a new module needs no list kept by hand.
"""

import re
from functools import lru_cache
from pathlib import Path, PurePosixPath

from django import template
from django.conf import settings
from django.contrib.staticfiles import finders
from django.templatetags.static import static
from django.utils.html import format_html_join

register = template.Library()

# Static imports and re-exports of relative paths (`import(…)` in JSDoc types is not one).
IMPORT = re.compile(
    r"""(?:^|[;}\s])(?:import|export)\s+(?:[^'";()]*?\sfrom\s*)?['"](\.{1,2}/[^'"]+)['"]""",
    re.MULTILINE,
)


def module_graph(entry: str) -> list[str]:
    """The static paths of `entry` and every module it imports, in the order first met."""
    if settings.DEBUG:
        return _module_graph(entry)
    return list(_module_graph_cached(entry))


@lru_cache(maxsize=8)
def _module_graph_cached(entry: str) -> tuple[str, ...]:
    return tuple(_module_graph(entry))


def _module_graph(entry: str) -> list[str]:
    seen: list[str] = []
    pending = [entry]
    while pending:
        path = pending.pop(0)
        if path in seen:
            continue
        found = finders.find(path)
        if not found:
            continue
        seen.append(path)
        folder = PurePosixPath(path).parent
        for relative in IMPORT.findall(Path(found).read_text(encoding="utf-8")):
            pending.append(_normalised(folder / relative))
    return seen


def _normalised(path: PurePosixPath) -> str:
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            if parts:
                parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts)


@register.simple_tag
def module_preloads(entry: str) -> str:
    """The links, largest module first (a browser opens six connections to a host: MapLibre's
    megabyte should not queue behind small files)."""
    paths = sorted(module_graph(entry), key=lambda path: -Path(finders.find(path)).stat().st_size)
    return format_html_join(
        "\n", '<link rel="modulepreload" href="{}">', ((static(p),) for p in paths)
    )
