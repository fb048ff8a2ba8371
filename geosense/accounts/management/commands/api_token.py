from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from geosense.accounts.services import TOKEN_DAYS_DEFAULT, api_token_create


class Command(BaseCommand):
    help = (
        "Create a bearer token for the HTTP API and the socket, valid --days days, and print it "
        "(only its hash is kept)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--days",
            type=int,
            default=TOKEN_DAYS_DEFAULT,
            help=f"how long the token is valid (default {TOKEN_DAYS_DEFAULT} days)",
        )

    def handle(self, *args, username: str, days: int, **options) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        if not user.is_active:
            raise CommandError(f"user {username!r} is inactive")
        if not 1 <= days <= 3650:
            raise CommandError("--days must be from 1 to 3650")
        self.stdout.write(api_token_create(user=user, days=days))
