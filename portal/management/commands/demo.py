"""`manage.py demo`: the demo data of every app (each app's `demo.load`), idempotently."""

from importlib import import_module
from importlib.util import find_spec

from django.apps import apps
from django.core.management.base import BaseCommand
from django.db import transaction


class Command(BaseCommand):
    help = "Create the demo fleet, tenants, projects and users (password 'demo-password'); safe to run again."

    def handle(self, *args, **options):
        for app in apps.get_app_configs():
            if find_spec(f"{app.name}.demo") is None:
                continue
            with transaction.atomic():
                import_module(f"{app.name}.demo").load(self.stdout)
        self.stdout.write(self.style.SUCCESS("Demo ready."))
