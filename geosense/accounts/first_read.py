"""A view's first read of the database, made in the trip that reads the request's user.

An API view reads its user (a bearer token's row, or the cookie session's user) and then,
nearly always, one thing of that user's: the chat session its URL names, which must be theirs
(chat/api.py). Each read was a trip to the requests' pool (geosense/dbpool.py): ~23 µs of the
event loop, a thread's work and the GIL handed over and back (py-spy put 5.5 % of the loop's
samples at 200 users in the second trip's submit).

A view marked `@reads_first(read, *names)` has `read(user=user, **the URL's named values)` made
in the user's trip, right after the user is read and only when that user is authenticated. The
view asks for it with `first_read(request, read, user=..., ...)` and gets the outcome, value or
exception, as if it had read it then; a read made for other arguments (another user, another
URL value) or another function is never given out: that call reads in a trip of its own. A read
is given out once.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest
from django.urls import ResolverMatch

from geosense.dbpool import in_request_thread


@dataclass(frozen=True, slots=True)
class _Planned:
    """The read a view declared, with its arguments from the URL (the user comes later)."""

    read: Callable[..., Any]
    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Made:
    read: Callable[..., Any]
    kwargs: dict[str, Any]
    value: Any
    error: Exception | None


def reads_first(read: Callable[..., Any], *names: str) -> Callable:
    """Mark a view whose first read is `read(user=..., **{name: the URL's value})`."""

    def mark(view: Callable) -> Callable:
        view.first_read = (read, names)
        return view

    return mark


def first_read_planned(match: ResolverMatch | None) -> _Planned | None:
    """The read the resolved view declared (`reads_first`), if any."""
    declared = getattr(match.func, "first_read", None) if match is not None else None
    if declared is None:
        return None
    read, names = declared
    return _Planned(read, {name: match.kwargs[name] for name in names})


def first_read_make(user: Any, planned: _Planned | None) -> _Made | None:
    """In the user's trip, once the user is read: the planned read for an authenticated user,
    its exception kept for the view (which would have met it in its own trip)."""
    if planned is None or user is None or not user.is_authenticated:
        return None
    kwargs = {"user": user, **planned.kwargs}
    try:
        return _Made(planned.read, kwargs, planned.read(**kwargs), None)
    except Exception as error:
        return _Made(planned.read, kwargs, None, error)


def first_read_keep(request: HttpRequest, made: _Made | None) -> None:
    if made is not None:
        request._first_read = made


async def first_read(request: HttpRequest, read: Callable[..., Any], /, **kwargs: Any) -> Any:
    """`read(**kwargs)`: as made in the user's trip when that was this read with these
    arguments, else in a trip of its own to the requests' pool."""
    made = request.__dict__.pop("_first_read", None)
    if made is not None and made.read is read and made.kwargs == kwargs:
        if made.error is not None:
            raise made.error
        return made.value
    return await in_request_thread(read)(**kwargs)
