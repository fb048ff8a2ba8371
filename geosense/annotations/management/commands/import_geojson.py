import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from geosense.annotations.services import GeoJSONImportError, annotations_import_geojson
from geosense.annotations.types import ImportReport

SKIPPED_SHOWN = 10


class Command(BaseCommand):
    help = (
        "Import a GeoJSON FeatureCollection (WGS84) as annotations. Importing the same file "
        "again updates its features in place, matched by their ids; a feature without a class "
        "is skipped and reported, or takes --default-class."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("file", help="path of a .geojson / .json FeatureCollection")
        parser.add_argument(
            "--class-property",
            default="class",
            help='the feature property that names the class (default "class")',
        )
        parser.add_argument(
            "--default-class",
            default=None,
            help="the class of a feature without one (default: skip such features and say so)",
        )
        parser.add_argument(
            "--id-property",
            default=None,
            help="the feature property that identifies a feature across imports (default: the "
            "feature's GeoJSON id)",
        )

    def handle(
        self,
        *args,
        file: str,
        class_property: str,
        default_class: str | None,
        id_property: str | None,
        **options,
    ) -> None:
        path = Path(file)
        try:
            collection = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from exc
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CommandError(f"{path} is not valid JSON: {exc}; nothing imported") from exc
        try:
            report = annotations_import_geojson(
                collection=collection,
                class_property=class_property,
                source=f"import:{path.name}",
                default_class=default_class,
                id_property=id_property,
            )
        except GeoJSONImportError as exc:
            raise CommandError(f"{path}: {exc}; nothing imported") from exc
        self.stdout.write(f"Imported {path}: {_said(report)}")


def _said(report: ImportReport) -> str:
    """ "3 new, 1 updated, 2 unchanged; skipped 2 features without a class (features 4 and 9;
    see --default-class)"."""
    counts = [f"{report.created:,} new"]
    if report.updated or report.unchanged:
        counts += [f"{report.updated:,} updated", f"{report.unchanged:,} unchanged"]
    text = ", ".join(counts)
    if report.skipped:
        n = len(report.skipped)
        shown = [str(i) for i in report.skipped[:SKIPPED_SHOWN]]
        where = ", ".join(shown[:-1]) + f" and {shown[-1]}" if len(shown) > 1 else shown[0]
        if n > SKIPPED_SHOWN:
            where = ", ".join(shown) + f" and {n - SKIPPED_SHOWN:,} more"
        text += (
            f"; skipped {n:,} feature{'s' if n != 1 else ''} without a class "
            f"(feature{'s' if n != 1 else ''} {where}; see --default-class)"
        )
    return text
