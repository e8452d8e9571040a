"""The billing app: price lists, metering and invoices."""

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.db.models.signals import post_delete, post_save
from django.utils.translation import gettext_lazy as _

from portal.shell import AppPlugin, Link


class BillingConfig(AppConfig):
    name = "billing"
    verbose_name = _("Billing")
    plugin = AppPlugin(
        urls="billing.urls",
        api="billing.api",
        nav=(Link(_("Metering"), "billing-metering", permission="billing.view_meteredperiod"),),
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
