from django.urls import path

from . import api

urlpatterns = [
    path("sessions", api.sessions, name="api-sessions"),
    path("sessions/<uuid:session_id>", api.session_detail, name="api-session"),
    path(
        "sessions/<uuid:session_id>/message/stream", api.message_stream, name="api-message-stream"
    ),
    path(
        "sessions/<uuid:session_id>/message/resume/stream",
        api.resume_stream,
        name="api-resume-stream",
    ),
    path(
        "sessions/<uuid:session_id>/artifacts/<str:artifact_id>",
        api.artifact_detail,
        name="api-artifact",
    ),
    path("sessions/<uuid:session_id>/stop", api.stop, name="api-stop"),
    path("sessions/<uuid:session_id>/find-similar", api.find_similar, name="api-find-similar"),
]
