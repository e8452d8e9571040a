"""The audit page for platform staff: every audited change, newest first, filtered, and its CSV export.
Thin: parse the filters, call the selector, render or stream."""

from __future__ import annotations

import json
from collections.abc import Iterator

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET

from portal import audit, selectors
from portal.errors import bad_input
from portal.forms import AuditFilterForm
from portal.permissions import require_staff
from portal.spreadsheets import CsvWriter

PERMISSION = "portal.view_auditentry"
PER_PAGE = 50
CSV_HEADER = ["at", "action", "actor", "tenant", "subject_kind", "subject_id", "summary", "details"]
CSV_CHUNK = 2000


class _Echo:
    """A file that hands back what is written to it, for a streamed CSV."""

    def write(self, value: str) -> str:
        return value


def _csv_rows(entries) -> Iterator[str]:
    writer = CsvWriter(_Echo())  # no cell runs as a formula in the spreadsheet that opens it
    yield writer.writerow(CSV_HEADER)
    for entry in entries.iterator(chunk_size=CSV_CHUNK):
        yield writer.writerow(
            [
                entry.at.isoformat(),
                entry.action,
                entry.actor.get_username() if entry.actor else "",
                entry.tenant.slug if entry.tenant else "",
                entry.subject_kind,
                entry.subject_id,
                entry.summary,
                json.dumps(entry.details, sort_keys=True, ensure_ascii=False),
            ]
        )


def _first_error(form: AuditFilterForm) -> str:
    for field, errors in form.errors.items():
        label = form.fields[field].label if field in form.fields else ""
        return f"{label}: {errors[0]}" if label else errors[0]
    return ""


@login_required
@require_GET
def audit_log(request: HttpRequest) -> HttpResponse:
    """`?format=csv` streams exactly the rows the filters select, in the page's order, English summaries."""
    require_staff(user=request.user, permission=PERMISSION)
    kind = request.GET.get("format", "")
    if kind not in ("", "csv"):
        return bad_input(request, _("Unknown format %(format)r; use csv.") % {"format": kind[:20]})
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        if kind == "csv":
            return bad_input(request, _first_error(form))
        context = {"form": form, "page": None, "actions": selectors.audit_actions()}
        return render(request, "portal/audit.html", context, status=400)
    data = form.cleaned_data
    entries = selectors.audit_entries(
        action=data["action"],
        tenant=data["tenant"],
        actor=data["actor"],
        since=data["since"],
        until=data["until"],
        text=data["q"],
    )
    if kind == "csv":
        response = StreamingHttpResponse(_csv_rows(entries), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="audit.csv"'
        return response
    page = Paginator(entries, PER_PAGE).get_page(request.GET.get("page"))
    rows = [(entry, audit.render(entry)) for entry in page.object_list]
    context = {"form": form, "page": page, "rows": rows, "actions": selectors.audit_actions()}
    return render(request, "portal/audit.html", context)
