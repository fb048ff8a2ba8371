from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("annotations", "0002_revision"),
    ]

    operations = [
        migrations.AddField(
            model_name="annotationrevision",
            name="generation",
            field=models.CharField(default="", max_length=32),
        ),
        # The revision standing now names the content indexes were built from.
        migrations.RunSQL(
            "UPDATE annotations_annotationrevision SET generation = token",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
