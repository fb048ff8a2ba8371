from django.urls import path

from . import pages

urlpatterns = [
    path("chat/", pages.chat_page, name="chat"),
    path("chat/<uuid:session_id>/", pages.chat_page, name="chat-session"),
    path("chat/<uuid:session_id>/turns/", pages.turns_earlier, name="chat-turns-earlier"),
    path("chat/<uuid:session_id>/turns/<int:turn>/", pages.turn_partial, name="chat-turn"),
    path("chat/<uuid:session_id>/progress/", pages.turn_progress, name="chat-turn-progress"),
    path("chat/<uuid:session_id>/preview/", pages.message_preview, name="chat-message-preview"),
    path(
        "chat/<uuid:session_id>/pictures/<str:artifact_id>/",
        pages.shared_picture,
        name="chat-picture",
    ),
    path(
        "chat/<uuid:session_id>/messages/<int:message_id>/",
        pages.message_partial,
        name="chat-message",
    ),
]
