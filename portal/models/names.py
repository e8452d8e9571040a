"""The rules a tenant's or project's name must follow: namespaces are DNS labels that do not reach into
the cluster's own or another tenant's, and names that end up in e-mails are one line of text."""

from __future__ import annotations

import fnmatch
import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.utils.translation import gettext_lazy as _

# A Kubernetes namespace is an RFC 1123 DNS label: at most 63 characters of
# lower-case letters, digits and '-', starting and ending with an alphanumeric.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
dns_label_validator = RegexValidator(
    DNS_LABEL_PATTERN,
    _("Use lower-case letters, digits and hyphens; start and end with a letter or digit."),
    code="dns_label",
)
SLUG_MAX_LENGTH = 30  # two slugs and a hyphen still fit in a 63-character namespace
NAMESPACE_MAX_LENGTH = 63


def reserved_namespace_patterns() -> list[str]:
    """Namespaces no project may have: the cluster's own, its add-ons', and the portal's."""
    return [*settings.RESERVED_NAMESPACES, settings.PORTAL_NAMESPACE]


def reserved_pattern_of(namespace: str) -> str | None:
    return next((p for p in reserved_namespace_patterns() if fnmatch.fnmatchcase(namespace, p)), None)


def validate_namespace_not_reserved(namespace: str) -> None:
    if reserved_pattern_of(namespace):
        raise ValidationError(
            _("The namespace %(ns)s is reserved for the cluster."), code="reserved", params={"ns": namespace}
        )


# Names that end up in e-mail subjects and headers (tenants, projects, alert rules, agents) are one line
# of text: a control character, a line break above all, makes the mail library refuse the whole message.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def validate_no_control_characters(value: str) -> None:
    if CONTROL_CHARACTERS.search(value):
        raise ValidationError(
            _("Use no line breaks, tabs or other control characters."), code="control_characters"
        )
