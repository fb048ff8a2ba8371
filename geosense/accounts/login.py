"""The login form, throttled, and with the password hash off the shared thread.

Under ASGI every sync view and every `sync_to_async` ORM call of the process share one thread,
so a flood of logins (each a PBKDF2 hash of ~0.3 s) queued every other user's database work
behind it: a 16-way flood made a real login take 11.6 s. Here:

- The view is async; the password is checked in a thread of its own (`_PASSWORD_THREAD`), one
  hash at a time per process, and at most `WAITING_MAX` logins wait for it: more are refused
  at once ("try again in a moment") without hashing.
- Failures are counted in the cache (docs/security.md, "Login"): within a 15-minute window, 5
  failures for one username from one address, 30 from one address, or 100 for one username
  from anywhere refuse further attempts without checking the password. A successful login
  clears the username-and-address count.

The admin's login is this view too (geosense/urls.py): the admin then checks `is_staff`.
"""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import alogin
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.csrf import csrf_protect
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_http_methods

WINDOW_SECONDS = 15 * 60
# (what is counted, failures allowed within the window)
LIMITS = (("user-address", 5), ("address", 30), ("user", 100))
WAITING_MAX = 8

_PASSWORD_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="password")
_waiting = 0


def _keys(username: str, address: str) -> dict[str, str]:
    slot = int(time.time() // WINDOW_SECONDS)  # a fixed window: the counts expire with it
    name = username.strip().lower()[:150]
    return {
        "user-address": f"login:{slot}:ua:{name}:{address}",
        "address": f"login:{slot}:a:{address}",
        "user": f"login:{slot}:u:{name}",
    }


def login_refused(*, username: str, address: str) -> bool:
    """Whether the failures counted so far refuse this attempt before its password is read."""
    keys = _keys(username, address)
    counts = cache.get_many(list(keys.values()))
    return any(counts.get(keys[kind], 0) >= limit for kind, limit in LIMITS)


def login_failed(*, username: str, address: str) -> None:
    for key in _keys(username, address).values():
        if not cache.add(key, 1, timeout=WINDOW_SECONDS + 60):
            try:
                cache.incr(key)
            except ValueError:  # expired in between
                cache.add(key, 1, timeout=WINDOW_SECONDS + 60)


def login_succeeded(*, username: str, address: str) -> None:
    cache.delete(_keys(username, address)["user-address"])


REFUSED = "refused"
BUSY = "busy"


def _password_check(form: AuthenticationForm, username: str, address: str) -> bool | str:
    """In the password thread: the counts are read again right before hashing (logins that
    waited behind others see their failures), and a failure is counted before the next."""
    if login_refused(username=username, address=address):
        return REFUSED
    if form.is_valid():
        login_succeeded(username=username, address=address)
        return True
    login_failed(username=username, address=address)
    return False


async def password_check(form: AuthenticationForm, *, username: str, address: str) -> bool | str:
    """Check the login in the password thread: True, False, `REFUSED` (too many failures) or
    `BUSY` (too many logins already wait for the thread)."""
    global _waiting
    if _waiting >= WAITING_MAX:
        return BUSY
    _waiting += 1
    try:
        return await asyncio.get_running_loop().run_in_executor(
            _PASSWORD_THREAD, _password_check, form, username, address
        )
    finally:
        _waiting -= 1


def _address(request: HttpRequest) -> str:
    return request.META.get("REMOTE_ADDR") or "unknown"


def _next(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return settings.LOGIN_REDIRECT_URL


async def _page(request: HttpRequest, form: AuthenticationForm, *, refusal: str = "", status=200):
    context = {"form": form, "next": _next(request), "refusal": refusal}
    # Rendering reads request.user (the header): sync ORM, so through sync_to_async.
    return await sync_to_async(render)(request, "registration/login.html", context, status=status)


@sensitive_post_parameters("password")
@csrf_protect
@require_http_methods(["GET", "POST"])
async def login_view(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return await _page(request, AuthenticationForm(request))
    username = request.POST.get("username", "")
    address = _address(request)
    form = AuthenticationForm(request, data=request.POST)
    if await sync_to_async(login_refused)(username=username, address=address):
        outcome = REFUSED  # refused at once, without waiting for the password thread
    else:
        outcome = await password_check(form, username=username, address=address)
    if outcome == REFUSED:
        return await _page(
            request,
            form,
            refusal="Too many failed logins. Wait 15 minutes, then try again.",
            status=429,
        )
    if outcome == BUSY:
        return await _page(
            request, form, refusal="Too many logins at once. Try again in a moment.", status=429
        )
    if not outcome:
        return await _page(request, form)
    await alogin(request, form.get_user())
    return HttpResponseRedirect(_next(request))
