"""REST API of billing, served under /api/v1/ by the site shell: usage per pool and spec, invoices."""

from __future__ import annotations

from decimal import Decimal

from django.db.models import Prefetch
from django.http import Http404
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import generics, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer
from rest_framework.routers import SimpleRouter
from rest_framework.settings import api_settings

from billing import exports, invoicing, selectors
from billing.budgets.api import BudgetListView
from billing.models import CreditNote, Invoice, InvoiceLine
from pools.specs import Spec


class UsageSerializer(serializers.Serializer):
    pool = serializers.IntegerField(source="pool_id")
    project = serializers.CharField(source="pool__project__slug")
    tenant = serializers.CharField(source="pool__project__tenant__slug")
    spec = serializers.SerializerMethodField()
    seconds = serializers.IntegerField(source="held", help_text="Instance-seconds: instances held × seconds.")
    hours = serializers.SerializerMethodField()
    amount = serializers.SerializerMethodField()
    currency = serializers.CharField()

    def get_spec(self, row) -> str:
        return Spec(row["gpu_model"], row["profile"]).id

    def get_hours(self, row) -> str:
        return str((Decimal(row["held"]) / Decimal(3600)).quantize(Decimal("0.0001")))

    def get_amount(self, row) -> str:
        return str(invoicing.round_money(row["amount"] or Decimal(0), row["currency"]))


@extend_schema(
    parameters=[
        OpenApiParameter("project", str, description="A project's short name."),
        OpenApiParameter(
            "month",
            str,
            description="YYYY-MM in the billing time zone; default: this month to date.",
            pattern=r"^(2\d{3}-(0[1-9]|1[0-2]))?$",  # invoicing.FIRST_YEAR to LAST_YEAR, or blank
        ),
    ]
)
class UsageView(generics.ListAPIView):
    """Usage per pool and spec in a month: members see their tenants', finance everyone's."""

    serializer_class = UsageSerializer

    def get_queryset(self):
        params = self.request.query_params
        month = None
        if params.get("month"):
            try:
                month = invoicing.parse_month(params["month"])
            except invoicing.BadMonth as error:
                raise ValidationError({"month": [str(error)]}) from error
        rows = selectors.visible_usage(self.request.user)
        if params.get("project"):
            rows = rows.filter(pool__project__slug=params["project"])
        start, end = selectors.month_bounds(month)
        return selectors.usage_by_pool(rows, start, end)


@extend_schema_field({"type": "string", "example": "27720", "nullable": True})
class Money(serializers.Field):
    """An amount as text in its currency's minor unit (`27720` KRW, `12.50` USD): rounded once,
    half-up, as the invoice's lines are; `currency` says where the object keeps its currency."""

    def __init__(self, *, currency=lambda obj: obj.currency, **kwargs):
        super().__init__(read_only=True, **kwargs)
        self.currency = currency

    def get_attribute(self, instance):
        return super().get_attribute(instance), self.currency(instance)

    def to_representation(self, value) -> str | None:
        amount, currency = value
        return None if amount is None else str(invoicing.round_money(amount, currency))


@extend_schema_field({"type": "string", "pattern": r"^\d{4}-(0[1-9]|1[0-2])$", "example": "2026-11"})
class MonthField(serializers.DateField):
    """A month as `YYYY-MM`: the first day of it, shown without the day."""

    def __init__(self, **kwargs):
        super().__init__(format="%Y-%m", **kwargs)


class InvoiceLineSerializer(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    spec = serializers.SerializerMethodField()
    hours = serializers.SerializerMethodField()
    unit_price = serializers.SerializerMethodField(help_text="Per hour, every digit it was set with.")
    amount = Money(currency=lambda line: line.invoice.currency)

    class Meta:
        model = InvoiceLine
        fields = ["kind", "project", "spec", "hours", "unit_price", "amount"]

    def get_spec(self, line) -> str | None:
        return Spec(line.gpu_model, line.profile).id if line.kind == "usage" else None

    def get_hours(self, line) -> str | None:
        return str(line.hours.quantize(Decimal("0.0001"))) if line.kind == "usage" else None

    def get_unit_price(self, line) -> str | None:
        return None if line.unit_price is None else f"{line.unit_price.normalize():f}"


class CreditNoteSerializer(serializers.ModelSerializer):
    """A credit note of an invoice; amounts as text in the currency's minor unit."""

    subtotal = Money()
    tax = Money()
    total = Money()

    class Meta:
        model = CreditNote
        fields = ["number", "issued_at", "subtotal", "tax", "total", "reason"]


class InvoiceSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    month = MonthField()
    lines = InvoiceLineSerializer(many=True, read_only=True)
    credit_notes = CreditNoteSerializer(many=True, read_only=True)
    subtotal = Money()
    tax = Money()
    total = Money()
    credited = serializers.SerializerMethodField(help_text="The totals of its credit notes, summed.")

    class Meta:
        model = Invoice
        fields = [
            "id",
            "number",
            "tenant",
            "month",
            "state",
            "currency",
            "subtotal",
            "tax_rate",
            "tax",
            "total",
            "issued_at",
            "paid_at",
            "void_reason",
            "lines",
            "credit_notes",
            "credited",
        ]

    def get_credited(self, invoice) -> str:
        credited = sum((note.total for note in invoice.credit_notes.all()), Decimal(0))
        return str(invoicing.round_money(credited, invoice.currency))


class FileRenderer(BaseRenderer):
    """Lets `?format=csv|xlsx|pdf` through content negotiation; the export answers the file itself."""

    charset = None

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data


EXPORT_RENDERERS = [
    type(f"{kind.upper()}Renderer", (FileRenderer,), {"format": kind, "media_type": media.split(";")[0]})
    for kind, media in exports.FORMATS.items()
]


class InvoiceViewSet(viewsets.ReadOnlyModelViewSet):
    """Invoices: a tenant's admins see its issued ones, finance sees all."""

    serializer_class = InvoiceSerializer

    def handle_exception(self, exc):
        if self.action == "export":  # a refusal answers JSON, whichever file was asked for
            renderer = api_settings.DEFAULT_RENDERER_CLASSES[0]()
            self.request.accepted_renderer, self.request.accepted_media_type = renderer, renderer.media_type
        return super().handle_exception(exc)

    def perform_content_negotiation(self, request, force=False):
        try:
            return super().perform_content_negotiation(request, force)
        except Http404 as error:  # a format no renderer offers
            if self.action == "export":
                offered = ", ".join(exports.FORMATS)
                raise ValidationError({"format": [f"Formats offered: {offered}."]}) from error
            raise

    @extend_schema(
        parameters=[OpenApiParameter("format", str, enum=list(exports.FORMATS), required=True)],
        responses={(200, media.split(";")[0]): OpenApiTypes.BINARY for media in exports.FORMATS.values()},
    )
    @action(detail=True, methods=["get"], renderer_classes=EXPORT_RENDERERS)
    def export(self, request, pk=None):
        """The invoice as a file: CSV, XLSX or PDF."""
        kind = request.query_params.get("format", "")
        if kind not in exports.FORMATS:
            offered = ", ".join(exports.FORMATS)
            raise ValidationError({"format": [f"Formats offered: {offered}."]})
        return exports.download(exports.export(self.get_object(), kind))

    def get_queryset(self):
        lines = InvoiceLine.objects.select_related("project")
        return (
            selectors.visible_invoices(self.request.user)
            .select_related("tenant")
            .prefetch_related(
                Prefetch("lines", queryset=lines),
                Prefetch("credit_notes", queryset=CreditNote.objects.order_by("issued_at", "pk")),
            )
            .order_by("-month", "tenant__slug", "pk")
        )


router = SimpleRouter(trailing_slash=True)
router.register("invoices", InvoiceViewSet, basename="invoice")

urlpatterns = [
    path("usage/", UsageView.as_view(), name="usage"),
    path("budgets/", BudgetListView.as_view(), name="budgets"),
]
