"""`manage.py meter`: meter every period that has ended and is not metered yet, now."""

from django.core.management.base import BaseCommand

from billing import services


class Command(BaseCommand):
    help = "Meter every period that has ended and is not metered yet (safe to run again, or at once)."

    def handle(self, *args, **options):
        report = services.meter()
        self.stdout.write(report.summary())
        self.stdout.write(f"metering lag: {int(services.metering_lag().total_seconds())} s")
