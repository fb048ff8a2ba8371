from django.apps import AppConfig


class AnnotationsConfig(AppConfig):
    name = "geosense.annotations"
    label = "annotations"
