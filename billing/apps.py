"""The billing app: price lists, metering and invoices."""

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.db.models.signals import post_delete, post_save
from django.utils.translation import gettext_lazy as _

from portal.shell import AppPlugin, EmailTopic, Link

# The e-mails of issued invoices and credit notes to a tenant's admins (billing/mail.py), which they may
# turn off; a tenant's billing contact gets them regardless.
EMAIL_TOPIC = "invoices"


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
        ),
        tenant_sections=("billing.tenant_views.tenant_section",),
        approval_sections=("billing.tenant_views.approval_section",),
        workspaces=(Link(_("Billing"), "billing-home", permission="billing.view_invoice"),),
        project_sections=("billing.tenant_views.project_section",),
        pool_sections=("billing.tenant_views.pool_section",),
        email_topics=(
            EmailTopic(
                EMAIL_TOPIC,
                _("e-mail me my tenants' invoices"),
                _("Issued invoices and credit notes, with their PDF, if the tenant has no billing contact."),
            ),
        ),
    )

    def ready(self) -> None:
        from django.conf import settings

        from billing import prices
        from pools import pricing

        period = settings.METERING_PERIOD_SECONDS
        if period <= 0 or 3600 % period:
            # Periods must fit whole into every hour, so that no period straddles two months.
            raise ImproperlyConfigured(f"METERING_PERIOD_SECONDS must divide 3600, not {period}.")
        pricing.register_price_lookup(prices.hourly_price)
        # However a price is saved or deleted (admin, service, shell), estimates stop using the old one.
        for signal in (post_save, post_delete):
            signal.connect(
                prices.forget_after_change, sender="billing.Price", dispatch_uid=f"prices-{signal}"
            )
