"""Paging of API lists: `?limit=` (PAGE_SIZE unless given, at most 500) and `?offset=`; a value that
is not a whole number in range is a 400 that says so, never silently replaced by a default. And paging of
one of a page's lists under its own query parameter (`paged`), for pages that show several."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest
from django.utils.translation import gettext as _
from rest_framework import exceptions, pagination

MAX_LIMIT = 500
# Beyond any table's size, and far inside PostgreSQL's bigint: larger offsets are refused, not sent.
MAX_OFFSET = 10**12


def _whole_number(request, name: str, *, low: int, high: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    raw = raw.strip()
    if not raw.isascii() or not raw.isdigit() or len(raw) > len(str(high)) or not low <= int(raw) <= high:
        raise exceptions.ValidationError(
            {name: [_("Must be a whole number from %(low)s to %(high)s.") % {"low": low, "high": high}]}
        )
    return int(raw)


class LimitOffsetPagination(pagination.LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request) -> int | None:
        limit = _whole_number(request, self.limit_query_param, low=1, high=self.max_limit)
        return self.default_limit if limit is None else limit

    def get_offset(self, request) -> int:
        return _whole_number(request, self.offset_query_param, low=0, high=MAX_OFFSET) or 0

    def get_schema_operation_parameters(self, view) -> list[dict]:
        """The parameters with the bounds `get_limit` and `get_offset` enforce, so that the schema says
        which values are taken."""
        bounds = {
            self.limit_query_param: {"minimum": 1, "maximum": self.max_limit},
            self.offset_query_param: {"minimum": 0, "maximum": MAX_OFFSET},
        }
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"].update(bounds.get(parameter["name"], {}))
        return parameters


def paged(request: HttpRequest, rows, per_page: int, parameter: str) -> dict:
    """A page of `rows` under its own query parameter, with the addresses of the pages around it that keep
    every other parameter of the address; templates/monitoring/_pager.html draws it."""
    page = Paginator(rows, per_page).get_page(request.GET.get(parameter))

    def address(number: int) -> str:
        query = request.GET.copy()
        query[parameter] = str(number)
        return f"?{query.urlencode()}"

    return {
        "page": page,
        "previous": address(page.previous_page_number()) if page.has_previous() else "",
        "next": address(page.next_page_number()) if page.has_next() else "",
    }
