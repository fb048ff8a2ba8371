"""`python -m geosense.serve [Daphne's arguments]`: Daphne, on uvloop's event loop.

Daphne runs Twisted's asyncio reactor on a loop it makes when `daphne.server` is imported, so
the loop's kind is chosen before Daphne's own command can run any code of ours: this module sets
uvloop's policy, then hands its arguments to Daphne's command line unchanged (`-b`, `-p`, `-e`,
`--proxy-headers`, the application's path). `daphne geosense.asgi:application` serves the same
application on asyncio's own loop.

Why: at 200 users back to back the event loop's own Python (asyncio's `_run_once`, its selector,
handles and socket transports: the model client's connections) was ~1,200 of the ~5,400 Python
calls a turn costs the loop's thread, and the loop's thread holds the GIL for more than half of
the process's CPU. uvloop does that work in C (docs/benchmarks.md)."""

import asyncio
import logging
import sys

logger = logging.getLogger(__name__)


def event_loop_policy_install() -> bool:
    """uvloop's policy for the loops made from now on, where uvloop is installed (a declared
    dependency but on Windows); whether it was. Too late once Daphne's server module made its
    loop."""
    if "daphne.server" in sys.modules:
        raise RuntimeError("Daphne's loop exists already: set the policy before importing it")
    try:
        import uvloop
    except ImportError:
        if sys.platform != "win32":  # a virtualenv not synced since uvloop became a dependency
            logger.warning("uvloop is not installed: serving on asyncio's loop (run `uv sync`)")
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def main() -> None:
    event_loop_policy_install()
    from daphne.cli import CommandLineInterface

    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
