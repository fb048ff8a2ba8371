"""Admin for annotations: deleted ones stay visible here, and only here can they come back."""

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from .models import Annotation
from .services import annotations_restore, annotations_soft_delete


class DeletedFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("live", "live"), ("deleted", "deleted")]

    def queryset(self, request, queryset):
        if self.value() == "live":
            return queryset.filter(deleted_at__isnull=True)
        if self.value() == "deleted":
            return queryset.filter(deleted_at__isnull=False)
        return queryset


@admin.register(Annotation)
class AnnotationAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "category",
        "geometry_type",
        "area_m2",
        "length_m",
        "source",
        "deleted_at",
    ]
    list_filter = ["category", DeletedFilter]
    search_fields = ["=id", "category"]
    actions = ["soft_delete", "restore"]
    show_full_result_count = False
    fields = [
        "category",
        "attributes",
        "geometry",
        "area_m2",
        "length_m",
        "min_lon",
        "min_lat",
        "max_lon",
        "max_lat",
        "vectors",
        "source",
        "created",
        "updated",
        "deleted_at",
    ]
    # Geometry and everything derived from it change only through the services, which
    # keep measures, bounding box and vectors consistent.
    readonly_fields = [
        "geometry",
        "area_m2",
        "length_m",
        "min_lon",
        "min_lat",
        "max_lon",
        "max_lat",
        "vectors",
        "source",
        "created",
        "updated",
        "deleted_at",
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Annotation]:
        return Annotation.all_objects.all()

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if term.isdigit():
            return queryset.filter(pk=int(term)), False
        return queryset.filter(category__icontains=term) if term else queryset, False

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_add_permission(self, request) -> bool:
        return False

    @admin.display(description="geometry")
    def geometry_type(self, obj: Annotation) -> str:
        return str(obj.geometry.get("type", "")) if isinstance(obj.geometry, dict) else ""

    @admin.action(description="Soft-delete selected annotations", permissions=["change"])
    def soft_delete(self, request: HttpRequest, queryset: QuerySet[Annotation]) -> None:
        done = annotations_soft_delete(ids=list(queryset.values_list("id", flat=True)))
        self.message_user(
            request, f"Deleted {len(done)} annotations (restorable).", messages.SUCCESS
        )

    @admin.action(description="Restore selected deleted annotations", permissions=["change"])
    def restore(self, request: HttpRequest, queryset: QuerySet[Annotation]) -> None:
        done = annotations_restore(ids=list(queryset.values_list("id", flat=True)))
        self.message_user(request, f"Restored {len(done)} annotations.", messages.SUCCESS)
