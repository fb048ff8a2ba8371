from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("annotations", "0003_revision_generation"),
    ]

    operations = [
        migrations.CreateModel(
            name="DemoArea",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("seed", models.IntegerField()),
                ("annotations", models.IntegerField()),
                ("blocks", models.JSONField(default=list)),
                ("created", models.DateTimeField(auto_now_add=True)),
            ],
        ),
    ]
