from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "geosense.accounts"
    label = "accounts"
    verbose_name = "Accounts, tokens and credits"

    def ready(self) -> None:
        from . import signals  # noqa: F401  (connects the receivers)
