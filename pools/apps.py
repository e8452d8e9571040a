"""The pools app: capacity of the GPU fleet and the pools carved from it."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _

from pools import conf, task_names
from portal.shell import AppPlugin, EmailTopic, Link, Periodic, Route, TenantSetting

# The e-mails about a person's requests and pools (pools/notifications.py), which they may turn off.
EMAIL_TOPIC = "pools"
# The platform staff's permissions the pools pages and actions ask for (portal/permissions.py checks them).
APPROVE = "pools.approve_poolrequest"  # approvers: decide pool requests
VIEW_CAPACITY = "pools.view_gpucapacity"  # approvers and operators: the capacity and what-if pages
START_WHATIF = "pools.add_whatifrun"  # operators: ask for what-if runs
DRAIN_GPU = "pools.change_gpucapacity"  # operators: drain a GPU
DRAIN_NODE = "pools.change_nodecapacity"  # operators: drain a node
SET_QUOTAS = "pools.change_quota"  # operators and approvers: quotas and the tenants' admission policy


class PoolsConfig(AppConfig):
    name = "pools"
    verbose_name = _("GPU pools")
    plugin = AppPlugin(
        urls="pools.urls",
        api="pools.api.urls",
        nav=(
            Link(
                _("Approvals"), "approvals", permission=APPROVE, count="pools.views.approvals.awaiting_count"
            ),
            Link(_("Capacity"), "capacity-dashboard", permission=VIEW_CAPACITY),
        ),
        # Approvers land on their queue, operators on the capacity dashboard.
        workspaces=(
            Link(_("Approvals"), "approvals", permission=APPROVE),
            Link(_("Capacity"), "capacity-dashboard", permission=VIEW_CAPACITY),
        ),
        tenant_tabs=(
            Link(_("All requests"), "tenant-requests"),
            Link(_("All pools"), "tenant-pools"),
        ),
        project_sections=("pools.views.sections.project_section",),
        tenant_sections=("pools.views.sections.tenant_section",),
        tenant_figures=("pools.views.sections.tenant_figures",),
        readiness=("pools.selectors.readiness.cluster_checks",),
        metrics=("pools.metrics.collect",),
        periodic_tasks=(
            # Every cluster whose back-off has run out (pools/services/inventory.py).
            Periodic("sync-clusters", task_names.SYNC_ALL, lambda: conf.settings.CAPACITY_SYNC_SECONDS),
            # The queue runs after approvals and releases too; this catches capacity that freed up otherwise.
            Periodic("admit-waiting-requests", task_names.ADMIT, lambda: conf.settings.QUEUE_RUN_SECONDS),
            # POOL_REDRIVE_SECONDS, POOL_STUCK_SECONDS and WHATIF_RUN_SECONDS (pools/services/deadlines.py).
            Periodic("sweep-stuck-pools", task_names.SWEEP, lambda: conf.settings.POOL_SWEEP_SECONDS),
        ),
        # A what-if run takes minutes: workers of its own take them, apart from everything else.
        task_queues=(Route(task_names.WHATIF_RUN, lambda: conf.settings.WHATIF_QUEUE),),
        tenant_settings=(
            TenantSetting(
                "auto_approve_within_guarantee",
                bool,
                read="pools.api.quotas.read_auto_approve",
                write="pools.api.quotas.write_auto_approve",
                help_text=_(
                    "Requests within the tenant's guarantee are approved by the policy, skipping approvers."
                ),
            ),
            TenantSetting(
                "max_duration_hours",
                int,
                read="pools.api.quotas.read_max_duration",
                write="pools.api.quotas.write_max_duration",
                help_text=_(
                    "Each request of the tenant gives an end within this many hours; null: no end required."
                ),
                nullable=True,
            ),
        ),
        email_topics=(
            EmailTopic(
                EMAIL_TOPIC,
                _("e-mail me about my GPU requests and pools"),
                _("Decisions, activation, failure and release."),
            ),
        ),
    )

    def ready(self) -> None:
        conf.settings.check()  # a setting the environment gets wrong stops the process here, named
        # Each driver registers its kind on import; importing them here keeps base free of them.
        from pools.drivers import kubernetes, simulated  # noqa: F401
