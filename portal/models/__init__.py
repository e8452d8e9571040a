"""The portal's models, one module per concern; every name is importable from `portal.models`.

- tenancy: Tenant, Project, Membership, the roles, and `visible_tenant_ids`, the one place where
  tenancy is enforced (every `visible_to(user)` is built on it).
- names: the rules of tenants' and projects' names and namespaces.
- invitations: Invitation, a pending membership sent by e-mail.
- preferences: Preferences, a person's e-mails and their language.
- tokens: ApiToken, the keys of the REST API.
- audit: AuditEntry, the trail of changes staff account for.
- sent_emails: SentEmail, the shell's record that keeps each e-mail to once per subject and recipient.
- sso: GroupRole, which identity-provider groups give which roles; ProviderGrant, platform roles from one.
"""

from portal.models.audit import AuditEntry
from portal.models.invitations import (
    Invitation,
    InvitationQuerySet,
    InvitationStatus,
    invitation_expiry,
    new_invitation_token,
)
from portal.models.names import (
    CONTROL_CHARACTERS,
    DNS_LABEL_PATTERN,
    NAMESPACE_MAX_LENGTH,
    SLUG_MAX_LENGTH,
    dns_label_validator,
    reserved_namespace_patterns,
    reserved_pattern_of,
    validate_namespace_not_reserved,
    validate_no_control_characters,
)
from portal.models.preferences import Preferences
from portal.models.sent_emails import SentEmail
from portal.models.sso import STAFF, GroupRole, ProviderGrant, parse_role
from portal.models.tenancy import (
    ROLE_RANK,
    Membership,
    Project,
    Role,
    Tenant,
    TenantOwnedQuerySet,
    TenantQuerySet,
    higher_role,
    namespace_problem,
    roles_at_least,
    validate_project_namespace,
    visible_tenant_ids,
)
from portal.models.tokens import ApiToken, TokenRevocation, TokenStatus

__all__ = [
    "CONTROL_CHARACTERS",
    "DNS_LABEL_PATTERN",
    "NAMESPACE_MAX_LENGTH",
    "ROLE_RANK",
    "SLUG_MAX_LENGTH",
    "STAFF",
    "ApiToken",
    "AuditEntry",
    "GroupRole",
    "Invitation",
    "InvitationQuerySet",
    "InvitationStatus",
    "Membership",
    "Preferences",
    "Project",
    "ProviderGrant",
    "Role",
    "SentEmail",
    "Tenant",
    "TenantOwnedQuerySet",
    "TenantQuerySet",
    "TokenRevocation",
    "TokenStatus",
    "dns_label_validator",
    "higher_role",
    "invitation_expiry",
    "namespace_problem",
    "new_invitation_token",
    "parse_role",
    "reserved_namespace_patterns",
    "reserved_pattern_of",
    "roles_at_least",
    "validate_namespace_not_reserved",
    "validate_no_control_characters",
    "validate_project_namespace",
    "visible_tenant_ids",
]
