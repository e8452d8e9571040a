"""The form of the operators' what-if page: a month, a cluster or all, and fleet changes one a line; the
service (pools/whatif/runs.py) decides whether they make a run, and its refusals are shown beside the field
they are about."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from django import forms
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from pools import pricing
from pools.models import Cluster
from pools.placement.fleet_changes import ADD, REGROUP, REMOVE, FleetChangeError
from pools.selectors.history import HistoryError

CHANGES_LENGTH = 4000  # characters of each box of changes: far more than MAX_CHANGES lines need
# Which box of the form a refused fleet change came from, by the words its message opens with.
CHANGE_FIELDS = {f"--{ADD}": "add", f"--{REMOVE}": "remove", f"--{REGROUP}": "regroup"}


def last_month(now: datetime | None = None) -> str:
    """The month before this one in the billing time zone, as YYYY-MM: the newest month run whole."""
    today = (now or timezone.now()).astimezone(ZoneInfo(pricing.month_time_zone())).date()
    return f"{today.replace(day=1) - timedelta(days=1):%Y-%m}"


class WhatIfForm(forms.Form):
    """A month, a cluster or all, and fleet changes one a line; the service decides if they make a run."""

    month = forms.CharField(
        label=gettext_lazy("Month"),
        max_length=7,
        widget=forms.TextInput(attrs={"type": "month", "placeholder": "2026-11", "pattern": r"\d{4}-\d{2}"}),
    )
    cluster = forms.ChoiceField(label=gettext_lazy("Cluster"), required=False)
    add = forms.CharField(
        label=gettext_lazy("Add GPUs"),
        required=False,
        max_length=CHANGES_LENGTH,
        widget=forms.Textarea(
            attrs={"rows": 2, "spellcheck": "false", "placeholder": "8 H200-141GB training"}
        ),
        help_text=gettext_lazy(
            'One a line, "N MODEL [GROUP]", e.g. "8 H200-141GB training": N whole GPUs, MIG off, in new '
            "nodes of 8 GPUs, in that GPU group if one is named."
        ),
    )
    remove = forms.CharField(
        label=gettext_lazy("Remove nodes"),
        required=False,
        max_length=CHANGES_LENGTH,
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false", "placeholder": "h100-3"}),
        help_text=gettext_lazy('One a line, "NODE" ("CLUSTER/NODE" where clusters share the name).'),
    )
    regroup = forms.CharField(
        label=gettext_lazy("Move nodes to another GPU group"),
        required=False,
        max_length=CHANGES_LENGTH,
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false", "placeholder": "h100-1=inference"}),
        help_text=gettext_lazy('One a line, "NODE=GROUP"; "NODE=" takes the node out of any group.'),
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        names = Cluster.objects.order_by("name").values_list("name", flat=True)
        self.fields["cluster"].choices = [("", _("every cluster")), *((name, name) for name in names)]
        self.fields["month"].help_text = _("YYYY-MM, a calendar month in %(zone)s.") % {
            "zone": pricing.month_time_zone()
        }

    def changes(self) -> list[tuple[str, str]]:
        """The changes in the order they apply: the added GPUs, then the removed nodes, then the moved ones,
        each box's lines in their order; blank lines are no change."""
        data = self.cleaned_data
        return [
            (kind, line.strip())
            for kind, field in ((ADD, "add"), (REMOVE, "remove"), (REGROUP, "regroup"))
            for line in data.get(field, "").splitlines()
            if line.strip()
        ]

    def refused(self, error: Exception) -> None:
        """Show a refusal of the service beside the field it is about."""
        message = str(error)
        field = None
        if isinstance(error, FleetChangeError):
            field = next(
                (name for opening, name in CHANGE_FIELDS.items() if message.startswith(opening)), None
            )
        elif isinstance(error, HistoryError):
            field = "cluster" if message.startswith("No cluster") else "month"
        self.add_error(field, message)
