import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from geosense.annotations.services import GeoJSONImportError, annotations_import_geojson


class Command(BaseCommand):
    help = "Import a GeoJSON FeatureCollection (WGS84) as annotations: every feature or none."

    def add_arguments(self, parser) -> None:
        parser.add_argument("file", help="path of a .geojson / .json FeatureCollection")
        parser.add_argument(
            "--class-property",
            default="class",
            help='the feature property that names the class (default "class")',
        )

    def handle(self, *args, file: str, class_property: str, **options) -> None:
        path = Path(file)
        try:
            collection = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from exc
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CommandError(f"{path} is not valid JSON: {exc}; nothing imported") from exc
        try:
            count = annotations_import_geojson(
                collection=collection, class_property=class_property, source=f"import:{path.name}"
            )
        except GeoJSONImportError as exc:
            raise CommandError(f"{path}: {exc}; nothing imported") from exc
        self.stdout.write(f"Imported {count:,} annotations from {path}")
