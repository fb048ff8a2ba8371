"""The chat page: the user's sessions beside the map of annotations."""

from uuid import UUID

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from .models import ChatSession


@require_GET
@login_required
def chat_page(request: HttpRequest, session_id: UUID | None = None) -> HttpResponse:
    sessions = ChatSession.objects.filter(user=request.user)
    # Another user's session answers 404, as if it did not exist.
    current = get_object_or_404(sessions, pk=session_id) if session_id is not None else None
    return render(
        request,
        "chat/page.html",
        {
            "sessions": list(sessions),
            "current": current,
            "tile_url": settings.GEOSENSE_MAP_TILE_URL,
        },
    )
