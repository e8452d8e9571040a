"""The pools app: capacity of the GPU fleet and the pools carved from it."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _

from pools import conf, task_names
from portal.shell import AppPlugin, EmailTopic, Link, Periodic, Route, TenantSetting, check_queue_settings

# The e-mails about a person's requests and pools (pools/notifications.py), which they may turn off.
EMAIL_TOPIC = "pools"
# The platform staff's permissions the pools pages and actions ask for (portal/permissions.py checks them).
APPROVE = "pools.approve_poolrequest"  # approvers: decide pool requests
VIEW_CAPACITY = "pools.view_gpucapacity"  # approvers and operators: the capacity and what-if pages
START_WHATIF = "pools.add_whatifrun"  # operators: ask for what-if runs
DRAIN_GPU = "pools.change_gpucapacity"  # operators: drain a GPU
DRAIN_NODE = "pools.change_nodecapacity"  # operators: drain a node
SET_QUOTAS = "pools.change_quota"  # operators and approvers: quotas and the tenants' admission policy
# The tasks that drive pools, on PROVISIONING_QUEUE: a provisioning waits behind no sync, metering,
# collection, what-if run or e-mail. A queue run and the sweeper lead to provisioning and releases, so they
# go with them; the pools' e-mails (EVENT_EMAIL) go to the default queue.
PROVISIONING_TASKS = (
    task_names.PROVISION,
    task_names.SETTLE_MOVE,
    task_names.FINISH_RELEASE,
    task_names.RELEASE_RECLAIMED,
    task_names.ADMIT,
    task_names.SWEEP,
)
# Cluster syncs, on SYNC_QUEUE: each holds a worker while it waits on its cluster (beat's watches it for
# CAPACITY_WATCH_SECONDS), every cluster due at once.
SYNC_TASKS = (task_names.SYNC_ALL, task_names.SYNC)


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
            # Every cluster whose back-off has run out, caught up by watch and watched for
            # CAPACITY_WATCH_SECONDS (pools/services/inventory.py).
            Periodic("sync-clusters", task_names.SYNC_ALL, lambda: conf.settings.CAPACITY_SYNC_SECONDS),
            # The queue runs after approvals and releases too; this catches capacity that freed up otherwise.
            Periodic("admit-waiting-requests", task_names.ADMIT, lambda: conf.settings.QUEUE_RUN_SECONDS),
            # POOL_REDRIVE_SECONDS, POOL_STUCK_SECONDS and WHATIF_RUN_SECONDS (pools/services/deadlines.py).
            Periodic("sweep-stuck-pools", task_names.SWEEP, lambda: conf.settings.POOL_SWEEP_SECONDS),
        ),
        # Provisioning and what drives it, cluster syncs, and what-if runs (minutes each) each on a queue of
        # their own, with workers of their own: a burst of one never delays another.
        task_queues=(
            *(Route(task, lambda: conf.settings.PROVISIONING_QUEUE) for task in PROVISIONING_TASKS),
            *(Route(task, lambda: conf.settings.SYNC_QUEUE) for task in SYNC_TASKS),
            Route(task_names.WHATIF_RUN, lambda: conf.settings.WHATIF_QUEUE),
        ),
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
        check_queue_settings(conf.settings, "PROVISIONING_QUEUE", "SYNC_QUEUE", "WHATIF_QUEUE")
        # Each driver registers its kind on import; importing them here keeps base free of them.
        from pools.drivers import kubernetes, simulated  # noqa: F401
