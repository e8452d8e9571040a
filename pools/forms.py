"""Forms of the tenant pages of pools; they only parse input, services decide."""

from collections.abc import Mapping

from django import forms
from django.db.models import QuerySet
from django.utils.translation import gettext_lazy as _

from pools.models import Cluster, GpuGroup, PoolRequest
from pools.services.requests import MAX_ITEMS
from pools.specs import Spec
from portal.models import Project

ITEM_ROWS = 4  # lines of spec × count a new form shows; "Add a line" gives more, up to MAX_ITEMS


def rows_for(*sources: Mapping | None, more: int = 0) -> int:
    """How many item lines a form needs to show the `spec_<n>` values of `sources` (posted data, initial
    values), with `more` empty lines after them: at least ITEM_ROWS, at most MAX_ITEMS."""
    used = [
        int(key[5:]) + 1
        for source in sources
        if source
        for key in source
        if key.startswith("spec_") and key[5:].isascii() and key[5:].isdigit() and source.get(key)
    ]
    return min(MAX_ITEMS, max(ITEM_ROWS, max(used, default=0) + more))


class PoolRequestForm(forms.Form):
    """Lines of spec × count (`rows` of them), where to place them, and why."""

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
    end_at = forms.DateTimeField(
        label=_("Ends on"),
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text=_("The pool is released by itself then, and billing stops."),
    )
    duration_hours = forms.IntegerField(
        label=_("Or for so many hours"),
        min_value=1,
        max_value=87_600,
        required=False,
        help_text=_("Counted from when the pool is admitted."),
    )

    def __init__(self, *args, specs=(), rows: int = ITEM_ROWS, **kwargs):
        super().__init__(*args, **kwargs)
        self.rows = rows
        # People read `H100-80GB 3g.40gb`, as a request's items show it; the value stays the spec's id.
        choices = [("", "—")] + [(spec.id, spec.label) for spec in specs]
        # A `+me` choice is explained by the hint under the list, which the selects point at.
        hint = {"aria-describedby": "media-hint"} if any(spec.media_extension for spec in specs) else {}
        for n in range(rows):
            self.fields[f"spec_{n}"] = forms.ChoiceField(
                label=_("GPU"), choices=choices, required=False, widget=forms.Select(attrs=hint)
            )
            self.fields[f"count_{n}"] = forms.IntegerField(
                label=_("Count"), min_value=1, max_value=10_000, required=False
            )
        groups = sorted(set(GpuGroup.objects.values_list("name", flat=True)))
        self.fields["purpose"].choices = [("", _("any"))] + [(g, g) for g in groups]

    def item_rows(self):
        return [(self[f"spec_{n}"], self[f"count_{n}"]) for n in range(self.rows)]

    @property
    def may_add_row(self) -> bool:
        return self.rows < MAX_ITEMS

    def items(self) -> list[tuple[str, int]]:
        data = self.cleaned_data
        return [
            (data[f"spec_{n}"], data[f"count_{n}"] or 1) for n in range(self.rows) if data.get(f"spec_{n}")
        ]

    def end(self) -> dict:
        """The end asked for, as `submit_request` takes it."""
        hours = self.cleaned_data.get("duration_hours")
        return {
            "end_at": self.cleaned_data.get("end_at"),
            "hold_seconds": None if hours is None else hours * 3600,
        }


def _moment_field(label, help_text="") -> forms.DateTimeField:
    return forms.DateTimeField(
        label=label,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text=help_text,
    )


class ExtendForm(forms.Form):
    """A later end for a pool, and why."""

    end_at = _moment_field(_("New end"))
    justification = forms.CharField(
        label=_("Why it needs longer"),
        max_length=4000,
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
    )


class GrowForm(forms.Form):
    """More of one spec in a pool."""

    spec = forms.ChoiceField(label=_("GPU"))
    count = forms.IntegerField(label=_("Count"), min_value=1, max_value=10_000, initial=1)
    justification = forms.CharField(
        label=_("Why you need it"), max_length=4000, required=False, widget=forms.Textarea(attrs={"rows": 2})
    )

    def __init__(self, *args, specs=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["spec"].choices = [(spec.id, spec.label) for spec in specs]


class ShrinkForm(forms.Form):
    """Live allocations of a pool to give back, by their ids."""

    allocation = forms.TypedMultipleChoiceField(label=_("Give back"), coerce=int)

    def __init__(self, *args, allocation_ids=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["allocation"].choices = [(n, n) for n in allocation_ids]


def copied_request(request: PoolRequest) -> dict:
    """The initial values of a new request asking for the same as `request`: its items, cluster,
    workload type and justification."""
    initial = {
        "cluster": request.cluster.name if request.cluster else None,
        "purpose": request.purpose,
        "justification": request.justification,
    }
    for n, item in enumerate(request.items.all()):
        initial[f"spec_{n}"] = Spec(item.gpu_model, item.profile).id
        initial[f"count_{n}"] = item.count
    return initial


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
