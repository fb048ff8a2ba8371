"""Every answer under /api/ (and /tiles/, the map's tiles) is JSON, errors included.

Django answers some requests before (or instead of) a view, in HTML: an unknown path (404), a
method a view does not take (405), a failed CSRF check (403), an exception (500). A script
reading the API gets `{"error": "..."}` for each of them instead, and an anonymous write gets
the contract's `401 {"error": "authentication required"}` rather than a CSRF page: without a
login there is nothing a forged request could do, so the missing login is the answer.
"""

from http import HTTPStatus

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import sync_and_async_middleware

API_PREFIXES = ("/api/", "/tiles/")


def is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIXES)


def answer_as_json(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """The answer, made JSON where it is an API's error in HTML (the middleware's response step;
    also its async twin's, geosense/middleware.py)."""
    if (
        not is_api(request)
        or response.status_code < 400
        or getattr(response, "streaming", False)
        or response.get("Content-Type", "").startswith("application/json")
    ):
        return response
    status = response.status_code
    message = {
        404: "not found",
        405: f"method {request.method} not allowed",
        500: "internal server error",
    }.get(status) or HTTPStatus(status).phrase.lower()
    answer = JsonResponse({"error": message}, status=status)
    if "Allow" in response:
        answer["Allow"] = response["Allow"]
    return answer


@sync_and_async_middleware
def ApiJsonErrorsMiddleware(get_response):
    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest):
            return answer_as_json(request, await get_response(request))

    else:

        def middleware(request: HttpRequest):
            return answer_as_json(request, get_response(request))

    return middleware


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """`CSRF_FAILURE_VIEW`: JSON under /api/ (401 when nobody is logged in), Django's page
    elsewhere."""
    if not is_api(request):
        from django.views.csrf import csrf_failure as django_csrf_failure

        return django_csrf_failure(request, reason=reason)
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return JsonResponse({"error": "authentication required"}, status=401)
    return JsonResponse({"error": f"CSRF check failed: {reason}"}, status=403)
