from django.urls import path

from . import views

urlpatterns = [
    path("tokens", views.tokens, name="api-tokens"),
    path("tokens/<int:token_id>", views.token_detail, name="api-token"),
]
