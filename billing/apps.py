"""The billing app: price lists, metering and invoices."""

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.db.models.signals import post_delete, post_save
from django.utils.translation import gettext_lazy as _

from billing import conf
from portal.shell import AppPlugin, EmailTopic, Link, Periodic, Route, check_queue_settings

# The e-mails of issued invoices and credit notes to a tenant's admins (billing/mail.py), which they may
# turn off; a tenant's billing contact gets them regardless.
EMAIL_TOPIC = "invoices"
# The warnings to a tenant's admins as a budget's projection reaches 80 % and 100 % (billing/budgets/).
BUDGET_EMAIL_TOPIC = "budgets"


# Billing's tasks, every one on METERING_QUEUE: metering (a catch-up may take minutes), budget warnings, and
# the e-mails of invoices and credit notes, each rendering its PDF (a month's close sends one per tenant).
METERING_TASKS = (
    "billing.tasks.meter_usage",
    "billing.tasks.warn_budgets",
    "billing.tasks.email_invoice",
    "billing.tasks.email_credit_note",
)


# The shortest metering period. Shorter ones would multiply the rows metering writes (a period mark
# and a record per pool and spec every few seconds) and bill nothing differently: seconds are counted
# whole whatever the period.
SHORTEST_PERIOD = 60


def check_metering(period: int, delay: int) -> None:
    """Refuse metering settings that would bill wrongly or write without bound, naming the setting."""
    # Periods fit whole into every hour, so that no period straddles two months.
    if period < SHORTEST_PERIOD or 3600 % period:
        raise ImproperlyConfigured(
            f"METERING_PERIOD_SECONDS must be at least {SHORTEST_PERIOD} and divide 3600 "
            f"(60, 120, 300, 600, 900, 1800 or 3600, for example), not {period}."
        )
    # A period is metered only once it has ended: no release or admission can land in it after.
    if delay < 0:
        raise ImproperlyConfigured(f"METERING_DELAY_SECONDS must be 0 or more, not {delay}.")


class BillingConfig(AppConfig):
    name = "billing"
    verbose_name = _("Billing")
    plugin = AppPlugin(
        urls="billing.urls",
        api="billing.api",
        nav=(
            Link(_("Billing"), "billing-home", permission="billing.view_invoice"),
            Link(_("Metering"), "billing-metering", permission="billing.view_meteredperiod"),
        ),
        # A tenant's invoices are for its admins (and finance); what its pools cost, for every member.
        tenant_tabs=(
            Link(_("Invoices"), "tenant-invoices", permission="billing.view_invoice", tenant_role="admin"),
            Link(_("Budgets"), "tenant-budgets", tenant_role="admin"),
        ),
        tenant_sections=("billing.tenant_views.tenant_section", "billing.budgets.views.tenant_section"),
        approval_sections=("billing.tenant_views.approval_section",),
        workspaces=(Link(_("Billing"), "billing-home", permission="billing.view_invoice"),),
        project_sections=("billing.tenant_views.project_section", "billing.budgets.views.project_section"),
        pool_sections=("billing.tenant_views.pool_section",),
        metrics=("billing.metrics.collect",),
        periodic_tasks=(
            # Meters every ended period not metered yet.
            Periodic("meter-usage", "billing.tasks.meter_usage", lambda: conf.settings.METERING_RUN_SECONDS),
            # Warns tenants' admins as a budget's projection reaches 80 % and 100 %, once each a month.
            Periodic(
                "warn-budgets", "billing.tasks.warn_budgets", lambda: conf.settings.BUDGET_CHECK_SECONDS
            ),
        ),
        task_queues=tuple(Route(task, lambda: conf.settings.METERING_QUEUE) for task in METERING_TASKS),
        email_topics=(
            EmailTopic(
                EMAIL_TOPIC,
                _("e-mail me my tenants' invoices"),
                _("Issued invoices and credit notes, with their PDF, if the tenant has no billing contact."),
            ),
            EmailTopic(
                BUDGET_EMAIL_TOPIC,
                _("e-mail me my tenants' budget warnings"),
                _("When a budget's projected month-end cost reaches 80 % and 100 % of it, once each month."),
            ),
        ),
    )

    def ready(self) -> None:
        from billing import invoicing, prices
        from billing.budgets import standing
        from pools import budgets, pricing

        conf.settings.check()
        check_queue_settings(conf.settings, "METERING_QUEUE")
        check_metering(conf.settings.METERING_PERIOD_SECONDS, conf.settings.METERING_DELAY_SECONDS)
        pricing.register_billing(
            price=prices.hourly_price,
            currency=lambda: conf.settings.BILLING_CURRENCY,
            time_zone=lambda: conf.settings.BILLING_TIME_ZONE,
            round_money=lambda amount: invoicing.round_money(amount, conf.settings.BILLING_CURRENCY),
        )
        budgets.register_budgets(standings=standing.standings)
        # However a price is saved or deleted (admin, service, shell), estimates stop using the old one.
        for signal in (post_save, post_delete):
            signal.connect(
                prices.forget_after_change, sender="billing.Price", dispatch_uid=f"prices-{signal}"
            )
