from django.core.management.base import BaseCommand, CommandError

from geosense.annotations.services import (
    DEMO_PASSWORD,
    DEMO_USERNAME,
    MAX_DEMO_ANNOTATIONS,
    demo_seed,
)


class Command(BaseCommand):
    help = "Create the demo user (demo / demo, 100 credits) and a neighbourhood of annotations."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--annotations",
            type=int,
            default=2000,
            help=f"how many annotations (up to {MAX_DEMO_ANNOTATIONS:,}; default 2,000)",
        )
        parser.add_argument(
            "--seed", type=int, default=0, help="random seed of the layout (default 0)"
        )

    def handle(self, *args, annotations: int, seed: int, **options) -> None:
        try:
            report = demo_seed(annotations=annotations, seed=seed)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if report.created:
            replaced = (
                f" (replacing {report.replaced} earlier demo annotations)"
                if report.replaced
                else ""
            )
            done = f"Seeded {report.created:,} annotations around {report.place}{replaced}"
        else:
            done = f"Already seeded: {report.total:,} annotations around {report.place}, nothing changed"
        self.stdout.write(f"{done}; demo user: {DEMO_USERNAME} / {DEMO_PASSWORD}")
