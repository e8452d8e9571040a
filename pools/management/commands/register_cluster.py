"""`manage.py register_cluster NAME [--kubeconfig PATH | --in-cluster] [--context CTX]
[--mig-config-map NS/NAME] [--device-plugin-config-map NS/NAME] [--prometheus-url URL]`.

Without --kubeconfig or --in-cluster, a registered cluster keeps the kubeconfig it has.
"""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from pools.services import ClusterSettings, register_cluster, sync_inventory
from portal.errors import PortalError


class Command(BaseCommand):
    help = (
        "Add (or update) a Kubernetes cluster. The kubeconfig is stored encrypted and never shown again; "
        "an update without --kubeconfig keeps it."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="cluster name (lower-case letters, digits and hyphens)")
        source = parser.add_mutually_exclusive_group()
        source.add_argument("--kubeconfig", type=Path, help="path of a kubeconfig file")
        source.add_argument(
            "--in-cluster", action="store_true", help="use the service account of the pod the portal runs in"
        )
        parser.add_argument("--context", default="", help="kubeconfig context (default: its current context)")
        parser.add_argument(
            "--mig-config-map",
            default="",
            help="namespace/name of the mig-parted ConfigMap (default gpu-operator/custom-mig-parted-config)",
        )
        parser.add_argument(
            "--device-plugin-config-map",
            default="",
            help="namespace/name of the device plugin's ConfigMap, where the portal writes its time-slicing "
            "and MPS configs (default gpu-operator/gpu-portal-device-plugin)",
        )
        parser.add_argument(
            "--prometheus-url",
            default=None,
            help="the cluster's Prometheus that scrapes dcgm-exporter (GPU figures are read from it), e.g. "
            "http://prometheus.monitoring:9090; a user:password@ in it is stored encrypted and never shown, "
            'an address without one keeps it for the same server; "" clears both',
        )
        parser.add_argument("--no-sync", action="store_true", help="do not read the cluster right away")

    def handle(
        self,
        *args,
        name,
        kubeconfig,
        in_cluster,
        context,
        mig_config_map,
        device_plugin_config_map,
        prometheus_url,
        no_sync,
        **options,
    ):
        text = None  # not given: a registered cluster keeps its stored kubeconfig
        if kubeconfig is not None:
            try:
                text = kubeconfig.read_text()
            except OSError as error:
                raise CommandError(f"Cannot read {kubeconfig}: {error.strerror}") from error
        try:
            cluster, created = register_cluster(
                ClusterSettings(
                    name=name,
                    kubeconfig=text,
                    context=context,
                    in_cluster=in_cluster,
                    mig_config_map=mig_config_map,
                    device_plugin_config_map=device_plugin_config_map,
                    prometheus_url=prometheus_url,
                )
            )
        except PortalError as error:
            raise CommandError(error.message) from error
        self.stdout.write(f"{'Registered' if created else 'Updated'} cluster {cluster.name}.")
        if not no_sync:
            report = sync_inventory(cluster=cluster)
            self.stdout.write(report.summary() if report else f"{cluster.name}: a sync is already running")
