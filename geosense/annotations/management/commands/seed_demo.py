from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from geosense.accounts.services import (
    DEMO_CREDITS,
    DEMO_PASSWORD,
    DEMO_USERNAME,
    demo_user_ensure,
    demo_user_reset,
)
from geosense.annotations.services import MAX_DEMO_ANNOTATIONS, demo_reset, demo_seed


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
        parser.add_argument(
            "--reset",
            action="store_true",
            help="also restore deleted demo annotations, demo's password and its credits",
        )

    def handle(self, *args, annotations: int, seed: int, reset: bool, **options) -> None:
        try:
            with transaction.atomic():
                if reset:
                    report, restored = demo_reset(annotations=annotations, seed=seed)
                    demo_user_reset()
                else:
                    report, restored = demo_seed(annotations=annotations, seed=seed), 0
                    demo_user_ensure()
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if report.created:
            replaced = (
                f" (replacing {report.replaced} earlier demo annotations)"
                if report.replaced
                else ""
            )
            done = f"Seeded {report.created:,} annotations around {report.place}{replaced}"
        elif reset:
            done = f"{report.total:,} annotations around {report.place}" + (
                f", {restored:,} deleted ones restored" if restored else ", none was deleted"
            )
        else:
            done = f"Already seeded: {report.total:,} annotations around {report.place}, nothing changed"
        if reset:
            done = f"Demo reset: {done}; {DEMO_CREDITS} credits"
        self.stdout.write(f"{done}; demo user: {DEMO_USERNAME} / {DEMO_PASSWORD}")
