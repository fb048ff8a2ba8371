from django.apps import AppConfig


class AnnotationsConfig(AppConfig):
    name = "geosense.annotations"
    label = "annotations"

    def ready(self) -> None:
        from django.db.models.signals import post_save

        from .models import Annotation, AnnotationRevision

        def bump(**_kwargs) -> None:
            AnnotationRevision.bump()

        # Single-row saves (admin edits, model helpers) change the revision here; bulk writes
        # and deletions in services.py bump it themselves (a post_delete receiver would make
        # every queryset delete fetch and signal row by row).
        post_save.connect(
            bump, sender=Annotation, weak=False, dispatch_uid="annotation_revision_save"
        )
