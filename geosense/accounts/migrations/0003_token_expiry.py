from datetime import timedelta

from django.db import migrations, models
from django.db.models import F


def expire_after_ninety_days(apps, schema_editor):
    """Tokens made before expiry existed live 90 days from their creation."""
    ApiToken = apps.get_model("accounts", "ApiToken")
    ApiToken.objects.update(expires=F("created") + timedelta(days=90))


class Migration(migrations.Migration):
    dependencies = [("accounts", "0002_charge_keyed_by_stored_call")]

    operations = [
        migrations.AddField(
            model_name="apitoken", name="expires", field=models.DateTimeField(null=True)
        ),
        migrations.RunPython(expire_after_ninety_days, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="apitoken", name="expires", field=models.DateTimeField()
        ),
    ]
