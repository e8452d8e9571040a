"""`manage.py close_month YYYY-MM`: build (or rebuild) the draft invoices of that month."""

from django.core.management.base import BaseCommand, CommandError

from billing import invoices
from portal.errors import PortalError


class Command(BaseCommand):
    help = "Build the draft invoices of a month that has ended (safe to run again: issued invoices stay)."

    def add_arguments(self, parser):
        parser.add_argument("month", help="YYYY-MM, in the billing time zone")

    def handle(self, *args, month, **options):
        try:
            closing = invoices.close_month(month)
        except PortalError as error:
            raise CommandError(error.message) from error
        self.stdout.write(closing.summary())
