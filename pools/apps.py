"""The pools app: capacity of the GPU fleet and the pools carved from it."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _

from portal.shell import AppPlugin, EmailTopic, Link

# The e-mails about a person's requests and pools (pools/notifications.py), which they may turn off.
EMAIL_TOPIC = "pools"


class PoolsConfig(AppConfig):
    name = "pools"
    verbose_name = _("GPU pools")
    plugin = AppPlugin(
        urls="pools.urls",
        api="pools.api.urls",
        nav=(
            Link(
                _("Approvals"),
                "approvals",
                permission="pools.approve_poolrequest",
                count="pools.approval_views.awaiting_count",
            ),
            Link(_("Capacity"), "capacity-dashboard", permission="pools.view_gpucapacity"),
        ),
        # Approvers land on their queue, operators on the capacity dashboard.
        workspaces=(
            Link(_("Approvals"), "approvals", permission="pools.approve_poolrequest"),
            Link(_("Capacity"), "capacity-dashboard", permission="pools.view_gpucapacity"),
        ),
        tenant_tabs=(
            Link(_("All requests"), "tenant-requests"),
            Link(_("All pools"), "tenant-pools"),
        ),
        project_sections=("pools.views.project_section",),
        tenant_sections=("pools.views.tenant_section",),
        tenant_figures=("pools.views.tenant_figures",),
        readiness=("pools.selectors.readiness.cluster_checks",),
        email_topics=(
            EmailTopic(
                EMAIL_TOPIC,
                _("e-mail me about my GPU requests and pools"),
                _("Decisions, activation, failure and release."),
            ),
        ),
    )

    def ready(self) -> None:
        # Each driver registers its kind on import; importing them here keeps base free of them.
        from pools.drivers import kubernetes, simulated  # noqa: F401
