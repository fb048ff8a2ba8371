"""The owner's tokens over the JSON API: list them, revoke one (docs/protocol.md)."""

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_http_methods

from .services import api_token_revoke, api_token_serialize, api_tokens_of_user


async def _user(request: HttpRequest):
    user = await request.auser()
    return user if user.is_authenticated else None


@require_GET
async def tokens(request: HttpRequest) -> JsonResponse:
    user = await _user(request)
    if user is None:
        return JsonResponse({"error": "authentication required"}, status=401)
    rows = await sync_to_async(api_tokens_of_user)(user=user)
    return JsonResponse({"tokens": [api_token_serialize(t) for t in rows]})


@require_http_methods(["DELETE"])
async def token_detail(request: HttpRequest, token_id: int) -> JsonResponse:
    user = await _user(request)
    if user is None:
        return JsonResponse({"error": "authentication required"}, status=401)
    if not await sync_to_async(api_token_revoke)(user=user, token_id=token_id):
        return JsonResponse({"error": "token not found"}, status=404)
    return JsonResponse({"revoked": token_id})
