from django.urls import path

from . import views

urlpatterns = [
    path("annotations", views.annotations_api, name="annotations-api"),
    path("annotations/boxes", views.annotation_boxes_api, name="annotation-boxes-api"),
]
