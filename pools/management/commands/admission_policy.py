"""`manage.py admission_policy --user U`: the admission policy and its binding the portal applies to each
cluster, as YAML for `kubectl apply -f -`, for a cluster whose operators apply them themselves."""

import yaml
from django.core.management.base import BaseCommand, CommandError

from pools.drivers.admission import portal_policy, portal_policy_binding


class Command(BaseCommand):
    help = (
        "Print the ValidatingAdmissionPolicy and its binding that keep other namespaces off the pools' GPUs, "
        "for the user the portal's credentials are in that cluster."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--user",
            required=True,
            help="the portal's user in the cluster, e.g. system:serviceaccount:gpu-portal:gpu-portal",
        )

    def handle(self, *args, user, **options):
        if not user.strip() or user != user.strip():
            raise CommandError("--user is the portal's user name in the cluster, without spaces around it.")
        self.stdout.write(yaml.safe_dump_all([portal_policy(user), portal_policy_binding()], sort_keys=False))
