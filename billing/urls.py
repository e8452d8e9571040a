"""Pages of the billing app."""

from django.urls import path, register_converter

from billing import tenant_views, views
from billing.budgets import views as budget_views


class MonthConverter:
    """`2026-11`: a month in the billing time zone (a month 13 is checked by the view)."""

    regex = r"[0-9]{4}-[0-9]{2}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(MonthConverter, "month")

urlpatterns = [
    path("billing/metering/", views.metering_status, name="billing-metering"),
    path("t/<slug:tenant_slug>/invoices/", tenant_views.tenant_invoices, name="tenant-invoices"),
    path(
        "t/<slug:tenant_slug>/invoices/<int:pk>/<slug:kind>/",
        tenant_views.tenant_invoice_download,
        name="tenant-invoice-download",
    ),
    path(
        "t/<slug:tenant_slug>/credit-notes/<int:pk>/pdf/",
        tenant_views.tenant_credit_note_pdf,
        name="tenant-credit-note-pdf",
    ),
    path("t/<slug:tenant_slug>/budgets/", budget_views.tenant_budgets, name="tenant-budgets"),
    path(
        "t/<slug:tenant_slug>/budgets/remove/", budget_views.tenant_budget_remove, name="tenant-budget-remove"
    ),
    path("billing/", views.finance_home, name="billing-home"),
    path("billing/<month:month>/", views.finance_month, name="billing-month"),
    path("billing/<month:month>/chart.svg", views.finance_chart, name="billing-month-chart"),
    path("billing/<month:month>/close/", views.finance_close, name="billing-month-close"),
    path("billing/<month:month>/issue/", views.finance_issue, name="billing-month-issue"),
    path("billing/<month:month>/export/<str:kind>/", views.finance_month_export, name="billing-month-export"),
    path("billing/invoices/<int:pk>/", views.finance_invoice, name="billing-invoice"),
    path("billing/credit-notes/<int:pk>/pdf/", views.credit_note_pdf, name="billing-credit-note-pdf"),
    path("billing/invoices/<int:pk>/<str:act>/", views.finance_invoice_act, name="billing-invoice-act"),
]
