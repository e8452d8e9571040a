"""Forms of the tenant pages of pools; they only parse input, services decide."""

from collections.abc import Mapping

from django import forms
from django.db.models import QuerySet
from django.utils.translation import gettext_lazy as _

from pools.models import Cluster, GpuGroup
from portal.models import Project

ITEM_ROWS = 4


class PoolRequestForm(forms.Form):
    """Up to four lines of spec × count, where to place them, and why."""

    cluster = forms.ModelChoiceField(
        label=_("Cluster"),
        queryset=Cluster.objects.order_by("name"),
        to_field_name="name",  # the value the specs API filters by
        required=False,
        empty_label=_("any cluster"),
    )
    purpose = forms.ChoiceField(label=_("Workload type"), required=False)
    justification = forms.CharField(
        label=_("Why you need it"), max_length=4000, required=False, widget=forms.Textarea(attrs={"rows": 3})
    )

    def __init__(self, *args, specs=(), **kwargs):
        super().__init__(*args, **kwargs)
        choices = [("", "—")] + [(spec.id, spec.id) for spec in specs]
        for n in range(ITEM_ROWS):
            self.fields[f"spec_{n}"] = forms.ChoiceField(label=_("GPU"), choices=choices, required=False)
            self.fields[f"count_{n}"] = forms.IntegerField(
                label=_("Count"), min_value=1, max_value=10_000, required=False
            )
        groups = sorted(set(GpuGroup.objects.values_list("name", flat=True)))
        self.fields["purpose"].choices = [("", _("any"))] + [(g, g) for g in groups]

    def item_rows(self):
        return [(self[f"spec_{n}"], self[f"count_{n}"]) for n in range(ITEM_ROWS)]

    def items(self) -> list[tuple[str, int]]:
        data = self.cleaned_data
        return [
            (data[f"spec_{n}"], data[f"count_{n}"] or 1) for n in range(ITEM_ROWS) if data.get(f"spec_{n}")
        ]


class ListFilterForm(forms.Form):
    """The filters of a tenant's list of requests or pools, read from the address: a state, a project.

    Projects are the tenant's own, so another tenant's project is an unknown choice, like a made-up one.
    """

    state = forms.ChoiceField(label=_("State"), required=False)
    project = forms.ModelChoiceField(
        label=_("Project"),
        queryset=Project.objects.none(),
        to_field_name="slug",  # the address names a project as its pages do
        required=False,
        empty_label=_("any"),
    )

    def __init__(
        self, data: Mapping[str, str] | None, *, projects: QuerySet[Project], states: list[tuple[str, str]]
    ):
        super().__init__(data)
        self.fields["project"].queryset = projects
        self.fields["project"].label_from_instance = lambda project: project.name
        self.fields["state"].choices = [("", _("any")), *states]

    def filters(self) -> dict:
        """The cleaned filters, as the list selectors take them."""
        return {"state": self.cleaned_data["state"], "project": self.cleaned_data["project"]}
