"""A cluster's Prometheus credential is stored encrypted, apart from its URL: a user:password@ already in
a stored URL moves into `prometheus_credential_encrypted`, and the URL keeps only the address. Prometheus
URLs are checked against the addresses the portal may send requests to (portal/outbound.py)."""

from urllib.parse import urlsplit, urlunsplit

import django.core.validators
from django.db import migrations, models

import portal.outbound
from pools import secrets


def move_credentials(apps, schema_editor):
    Cluster = apps.get_model("pools", "Cluster")
    for cluster in Cluster.objects.filter(prometheus_url__contains="@"):
        parts = urlsplit(cluster.prometheus_url)
        credential, at, server = parts.netloc.rpartition("@")
        if not at:  # an @ in the path, not a user part
            continue
        cluster.prometheus_url = urlunsplit(parts._replace(netloc=server))
        cluster.prometheus_credential_encrypted = secrets.encrypt(credential) if credential else ""
        cluster.save(update_fields=["prometheus_url", "prometheus_credential_encrypted"])


def restore_credentials(apps, schema_editor):
    Cluster = apps.get_model("pools", "Cluster")
    for cluster in Cluster.objects.exclude(prometheus_credential_encrypted="").exclude(prometheus_url=""):
        parts = urlsplit(cluster.prometheus_url)
        credential = secrets.decrypt(cluster.prometheus_credential_encrypted, what="Prometheus credential")
        cluster.prometheus_url = urlunsplit(parts._replace(netloc=f"{credential}@{parts.netloc}"))
        cluster.save(update_fields=["prometheus_url"])


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0007_whatif_start_permission"),
    ]

    operations = [
        migrations.AddField(
            model_name="cluster",
            name="prometheus_credential_encrypted",
            field=models.TextField(blank=True, editable=False),
        ),
        migrations.AlterField(
            model_name="cluster",
            name="prometheus_url",
            field=models.URLField(
                blank=True,
                help_text="The cluster's Prometheus that scrapes the GPU Operator's dcgm-exporter, e.g. http://prometheus.monitoring:9090. GPU figures are read from it; leave empty when node agents push them instead. A user:password@ in the address is stored encrypted, apart from it, and never shown again; the address given without one keeps it while it names the same server.",
                validators=[
                    django.core.validators.URLValidator(schemes=["http", "https"]),
                    portal.outbound.validate_outbound_url,
                ],
                verbose_name="Prometheus URL",
            ),
        ),
        migrations.RunPython(move_credentials, restore_credentials),
    ]
