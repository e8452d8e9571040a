"""`manage.py sync_clusters`: one inventory sync of every cluster, now."""

from django.core.management.base import BaseCommand, CommandError

from pools.models import Cluster
from pools.services import sync_inventory


class Command(BaseCommand):
    help = "Read every cluster's nodes, GPUs and GPU pods now, whatever their back-off."

    def add_arguments(self, parser):
        parser.add_argument("clusters", nargs="*", help="only these clusters (default: all)")

    def handle(self, *args, clusters, **options):
        queryset = Cluster.objects.order_by("name")
        if clusters:
            queryset = queryset.filter(name__in=clusters)
            missing = set(clusters) - set(queryset.values_list("name", flat=True))
            if missing:
                raise CommandError(f"Unknown cluster(s): {', '.join(sorted(missing))}")
        failed = []
        for cluster in queryset:
            report = sync_inventory(cluster=cluster)
            if report is None:
                self.stdout.write(f"{cluster.name}: skipped, another sync is running")
                continue
            self.stdout.write(report.summary())
            if not report.ok:
                failed.append(cluster.name)
        if failed:
            raise CommandError(f"{len(failed)} cluster(s) could not be read: {', '.join(failed)}")
