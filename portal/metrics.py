"""/metrics: every app's figures and the portal's processes' own, in the Prometheus text format, for a
Prometheus that scrapes the portal.

What it says: the families each app's plugin names (`AppPlugin.metrics`, read at scrape time: the fleet's
GPUs from monitoring, requests and pools from pools, metering from billing), then the web processes' and the
task queue's (portal/telemetry.py).

Who may read it: a request bearing `Authorization: Bearer <METRICS_TOKEN>` (when the setting is set), or,
while no proxy is trusted (TRUSTED_PROXY_COUNT 0), one from an address in METRICS_ALLOWED_NETWORKS; anyone
else gets a plain 403. Behind a proxy the address is never believed: every client of an ingress controller
arrives from the cluster's own network (and the portal refuses to start without a token there:
portal/startup.py). Where: with METRICS_PORT, only on that port, which the deployment's web Service and
Ingress never reach (portal/telemetry.py); the public port answers 404.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Iterator

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.gzip import gzip_page
from django.views.decorators.http import require_safe
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from portal import shell, telemetry

log = logging.getLogger(__name__)


# --- who may read it --------------------------------------------------------------------------------


def _bears_token(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    scheme, _space, given = request.headers.get("Authorization", "").partition(" ")
    if not token or scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def _from_allowed_network(request: HttpRequest) -> bool:
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    for entry in settings.METRICS_ALLOWED_NETWORKS:
        try:
            network = ipaddress.ip_network(entry.strip(), strict=False)
        except ValueError:
            log.warning("METRICS_ALLOWED_NETWORKS: %r is not a network; ignored", entry)
            continue
        if address.version == network.version and address in network:
            return True
    return False


def may_read(request: HttpRequest) -> bool:
    if _bears_token(request):
        return True
    return settings.TRUSTED_PROXY_COUNT == 0 and _from_allowed_network(request)


# --- what it says -----------------------------------------------------------------------------------


class AppFigures:
    """Every app's families, each app's collectors called at scrape time (prometheus_client's custom
    collector protocol), in the order of INSTALLED_APPS."""

    def collect(self) -> Iterator[Metric]:
        for _path, collect in shell.metric_collectors():
            yield from collect()


@require_safe
@gzip_page  # Prometheus asks for gzip; a big fleet's text shrinks about tenfold
def metrics(request: HttpRequest) -> HttpResponse:
    if not telemetry.serves_metrics(request):
        raise Http404
    if not may_read(request):
        return HttpResponse(
            "Forbidden: send Authorization: Bearer <token>"
            + ("" if settings.TRUSTED_PROXY_COUNT else ", or scrape from an allowed network")
            + ".\n",
            status=403,
            content_type="text/plain; charset=utf-8",
        )
    # The web processes' own figures follow the apps': one scrape for both.
    body = generate_latest(AppFigures()) + telemetry.latest()
    response = HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response
