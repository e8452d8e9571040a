"""Storage of the simulated GPU fleet, so that web, worker and beat see the same cluster."""

from django.db import models
from django.utils.translation import gettext_lazy as _


class SimulatedClusterState(models.Model):
    """The whole state of one simulated cluster as one JSON document, changed under a row lock."""

    cluster = models.OneToOneField(
        "pools.Cluster", on_delete=models.CASCADE, related_name="simulation", verbose_name=_("cluster")
    )
    state = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("simulated cluster state")
        verbose_name_plural = _("simulated cluster states")

    def __str__(self) -> str:
        return f"simulation of {self.cluster_id}"
