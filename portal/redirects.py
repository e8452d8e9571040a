"""Where a button sends a person back to after it acts."""

from django.http import HttpRequest
from django.utils.http import url_has_allowed_host_and_scheme


def back_to(request: HttpRequest, fallback: str) -> str:
    """The page named by `next` (posted or in the address) when it is a path of this site, else `fallback`:
    a button shown on several pages returns to the one it was pressed on, and never to another site."""
    wanted = request.POST.get("next") or request.GET.get("next") or ""
    if wanted.startswith("/") and url_has_allowed_host_and_scheme(
        wanted, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return wanted
    return fallback
