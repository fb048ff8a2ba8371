from django.conf import settings
from django.core.management.base import BaseCommand

from geosense.accounts.services import local_superuser_ensure


class Command(BaseCommand):
    help = (
        "Ensure the local superuser named in .env (GEOSENSE_ADMIN_USERNAME / "
        "GEOSENSE_ADMIN_PASSWORD) and print its login. Development only: does nothing with "
        "DEBUG off."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--url", default="", help="where the app is served, to print the admin's address"
        )

    def handle(self, *args, url: str, **options) -> None:
        if not settings.DEBUG:
            self.stderr.write("DEBUG is off: no local superuser (it is for development only).")
            return
        username = settings.GEOSENSE_ADMIN_USERNAME
        password = settings.GEOSENSE_ADMIN_PASSWORD
        if not username or not password:
            self.stderr.write(
                "No local superuser: GEOSENSE_ADMIN_USERNAME and GEOSENSE_ADMIN_PASSWORD are "
                "not both set (make run writes them to .env)."
            )
            return
        local_superuser_ensure(username=username, password=password)
        where = f"The admin is at {url.rstrip('/')}/admin/: " if url else "Local superuser: "
        self.stdout.write(f"{where}log in as {username} / {password}")
