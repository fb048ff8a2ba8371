from django.urls import path

from . import views

urlpatterns = [
    path("annotations.json", views.annotation_tileset, name="annotation-tileset"),
    path("annotations/<int:z>/<int:x>/<int:y>.mvt", views.annotation_tile, name="annotation-tile"),
]
