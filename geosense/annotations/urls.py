from django.urls import path

from . import views

urlpatterns = [
    path("annotations", views.annotations_api, name="annotations-api"),
]
