"""REST API of budgets (`/api/v1/budgets/`): GET lists those a person may see, each with the month's
projection and what was spent to date; PUT creates or replaces one (a tenant's admins)."""

from __future__ import annotations

from django.http import Http404
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import generics, serializers
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from billing import invoicing
from billing.budgets import selectors, services
from billing.budgets.standing import Month, months
from billing.models import MONEY
from billing.selectors import this_month
from portal.errors import PortalError
from portal.models import Tenant


@extend_schema_field({"type": "string", "example": "1500000", "nullable": True})
class MonthMoney(serializers.Field):
    """An amount of a budget's month as text in its currency's minor unit; null where a price is unknown."""

    def __init__(self, **kwargs):
        super().__init__(read_only=True, **kwargs)

    def get_attribute(self, instance: Month):
        return super().get_attribute(instance), instance.budget.currency

    def to_representation(self, value) -> str | None:
        amount, currency = value
        return None if amount is None else str(invoicing.round_money(amount, currency))


class BudgetSerializer(serializers.Serializer):
    tenant = serializers.CharField(source="budget.tenant.slug", help_text=gettext_lazy("The tenant's slug."))
    project = serializers.CharField(
        source="budget.project.slug",
        allow_null=True,
        default=None,
        help_text=gettext_lazy("A project's slug; null for the whole tenant's budget."),
    )
    month_limit = serializers.CharField(source="budget.month_limit")
    currency = serializers.CharField(source="budget.currency")
    hard = serializers.BooleanField(
        source="budget.hard",
        help_text=gettext_lazy(
            "Requests that would take the projection past it wait for an approver's override."
        ),
    )
    month = serializers.SerializerMethodField(
        help_text=gettext_lazy("This month (YYYY-MM, billing's time zone).")
    )
    projected = MonthMoney(
        help_text=gettext_lazy("The month's cost projected to its end from what is held now.")
    )
    spent_to_date = MonthMoney(help_text=gettext_lazy("The month's cost so far."))

    def get_month(self, row: Month) -> str:
        return f"{this_month():%Y-%m}"


class BudgetChangeSerializer(serializers.Serializer):
    tenant = serializers.SlugField(max_length=50)
    project = serializers.SlugField(
        max_length=50,
        required=False,
        allow_null=True,
        help_text=gettext_lazy("A project of the tenant; left out or null: the whole tenant."),
    )
    month_limit = serializers.DecimalField(
        max_digits=MONEY["max_digits"], decimal_places=MONEY["decimal_places"], min_value=0
    )
    currency = serializers.CharField(max_length=3, help_text=gettext_lazy("Billing's currency (ISO 4217)."))
    hard = serializers.BooleanField(required=False, default=False)


class BudgetListView(generics.ListAPIView):
    """Budgets: a tenant's admins see their tenant's, platform staff all. A tenant's admins create or replace
    the tenant's budget or a project's."""

    serializer_class = BudgetSerializer

    def get_queryset(self):
        return selectors.visible_budgets(self.request.user)

    def get_object(self):
        """A budget is named by its body (tenant, project), not by an address: none lives at this one."""
        raise Http404

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        return months(queryset if page is None else page)

    @extend_schema(
        request=BudgetChangeSerializer,
        responses={
            200: BudgetSerializer,
            404: OpenApiResponse(description="No such tenant, or not yours to see."),
        },
    )
    def put(self, request):
        body = BudgetChangeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        values = body.validated_data
        tenant = Tenant.objects.visible_to(request.user).filter(slug=values["tenant"]).first()
        if tenant is None:
            raise Http404  # the same answer whether it does not exist or is another tenant's
        project = None
        if values.get("project"):
            project = tenant.projects.filter(slug=values["project"]).first()
            if project is None:
                raise ValidationError(
                    {
                        "project": [
                            _("Tenant %(tenant)s has no project %(project)s.")
                            % {"tenant": tenant.slug, "project": values["project"]}
                        ]
                    }
                )
        try:
            budget = services.set_budget(
                actor=request.user,
                tenant=tenant,
                project=project,
                month_limit=values["month_limit"],
                currency=values["currency"],
                hard=values["hard"],
            )
        except PortalError as error:
            if error.field:
                raise ValidationError({error.field: [error.message]}) from error
            raise
        return Response(BudgetSerializer(months([budget])[0]).data)
