from django.urls import path

from . import pages

urlpatterns = [
    path("chat/", pages.chat_page, name="chat"),
    path("chat/<uuid:session_id>/", pages.chat_page, name="chat-session"),
]
