"""A pool event's e-mail is sent once through the shell (`portal.mail.send_once`), which records each address
it went to: the events' own `emailed_at` goes, each e-mail it recorded kept as the shell's record of it, so
that a task delivered again after the upgrade still sends nothing twice."""

from django.db import migrations


def keep_sent_emails(apps, schema_editor):
    PoolEvent = apps.get_model("pools", "PoolEvent")
    SentEmail = apps.get_model("portal", "SentEmail")
    sent = (
        PoolEvent.objects.filter(emailed_at__isnull=False)
        .exclude(request__submitted_by__email="")
        .values_list("pk", "request__submitted_by__email", "emailed_at")
        .iterator(chunk_size=2000)
    )
    batch = []
    for pk, address, at in sent:
        batch.append(SentEmail(key=f"pools.event:{pk}", address=address.strip().lower(), sent_at=at))
        if len(batch) == 2000:
            SentEmail.objects.bulk_create(batch, ignore_conflicts=True)
            batch = []
    SentEmail.objects.bulk_create(batch, ignore_conflicts=True)


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0008_cluster_prometheus_credential"),
        ("portal", "0009_sent_email"),
    ]

    operations = [
        migrations.RunPython(keep_sent_emails, migrations.RunPython.noop, elidable=True),
        migrations.RemoveField(model_name="poolevent", name="emailed_at"),
    ]
