"""The billing app's settings, with their defaults: each is Django's setting of that name when one is set,
else the environment variable of that name, else the default here (portal/appsettings.py). Every billing
module reads its settings from `billing.conf.settings`; a name not declared here is the shell's.
"""

from portal.appsettings import AppSettings, Setting

settings = AppSettings(
    # Every price, usage record and invoice is in this currency (ISO 4217).
    BILLING_CURRENCY=Setting.str("KRW"),
    # Months of invoices are calendar months in this time zone.
    BILLING_TIME_ZONE=Setting.str("Asia/Seoul"),
    # The font of invoice PDFs, with a CJK font so that Hangul prints; in a .ttc collection, the index of the
    # face (Noto Sans CJK: 1 is Korean).
    BILLING_PDF_FONT=Setting.str("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc"),
    BILLING_PDF_FONT_INDEX=Setting.int(1, minimum=0),
    # Tax (percent) on an invoice whose tenant's billing profile names no rate of its own.
    BILLING_TAX_RATE=Setting.decimal("10", minimum=0),
    # An issued invoice not paid this many days after it was issued is overdue.
    BILLING_PAYMENT_DAYS=Setting.int(30, minimum=0),
    # Metering cuts time into periods of this many seconds (UTC, from the epoch) and meters a period
    # METERING_DELAY_SECONDS after it ends, when no release or admission can still land inside it
    # (both checked further when the app loads: billing/apps.py).
    METERING_PERIOD_SECONDS=Setting.int(3600),
    METERING_DELAY_SECONDS=Setting.int(60),
    # How often beat meters every ended period not metered yet.
    METERING_RUN_SECONDS=Setting.int(300, minimum=1),
    # Metering, budget warnings and the e-mails of invoices and credit notes (each renders its PDF) wait on a
    # queue of their own, so that a long catch-up or a month's invoices never delay provisioning, monitoring
    # or the portal's other e-mail; the workers of deploy/kubernetes/metering-worker-deployment.yaml and
    # ./scripts/run consume it, the others not.
    METERING_QUEUE=Setting.str("metering"),
    # How often beat weighs each budget against the month's projection and warns at 80 % and 100 %.
    BUDGET_CHECK_SECONDS=Setting.int(900, minimum=1),
)
