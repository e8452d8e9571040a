"""How signing up and signing in work here.

Sign-up is by invitation unless the portal is configured open. An invitation
link puts its token in the session and vouches for its one address (the link
went to that inbox): signing up with that address makes it verified and joins
the tenant; no other address can sign up through it. Failed sign-ins are
counted per account, whichever login (user name or e-mail) names it, and the
API's token endpoint counts into the same lock-out.
"""

from __future__ import annotations

from allauth.account.adapter import DefaultAccountAdapter
from allauth.account.models import EmailAddress
from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils.translation import gettext as _

from portal.models import Invitation
from portal.sso.session import logout_url
from portal.sso.stages import ALLAUTH_STAGE, STAGE

INVITATION_SESSION_KEY = "portal_invitation_token"
JOINED_TENANT_SESSION_KEY = "portal_joined_tenant"


def pending_invitation(request) -> Invitation | None:
    token = request.session.get(INVITATION_SESSION_KEY) if request is not None else None
    if not token:
        return None
    invitation = Invitation.objects.select_related("tenant").filter(token=token).first()
    return invitation if invitation and invitation.is_pending else None


def account_attempts_key(user_id: int) -> str:
    """The lock-out key of one account: failed passwords and wrong two-factor codes count here."""
    return f"account:{user_id}"


def login_attempts_key(login: str) -> str:
    """The lock-out key of the account a login names; a login that names none keys on itself."""
    login = login.strip().lower()
    User = get_user_model()
    if "@" in login:
        # The verified owner of an address, if any: an unverified claim must not split the count.
        addresses = EmailAddress.objects.filter(email__iexact=login)
        owners = set(addresses.filter(verified=True).values_list("user_id", flat=True))
        if not owners:
            owners = set(addresses.values_list("user_id", flat=True))
            owners |= set(User.objects.filter(email__iexact=login).values_list("pk", flat=True))
        user_id = owners.pop() if len(owners) == 1 else None
    else:
        user_id = User.objects.filter(username__iexact=login).values_list("pk", flat=True).first()
    return account_attempts_key(user_id) if user_id is not None else f"login:{login}"


class PasswordsOff(forms.ValidationError):
    """A right password, refused because local passwords are off for this person (LOCAL_PASSWORDS)."""


class AccountAdapter(DefaultAccountAdapter):
    def is_open_for_signup(self, request) -> bool:
        return settings.PORTAL_OPEN_SIGNUP or pending_invitation(request) is not None

    def _get_login_attempts_cache_key(self, request, **credentials) -> str:
        # allauth keys failed sign-ins on the login as typed and the site's host; one key per
        # account closes the gaps of switching between user name, e-mail and host names.
        return login_attempts_key(credentials.get("email") or credentials.get("username") or "")

    def authenticate(self, request, **credentials):
        """With LOCAL_PASSWORDS off, a right password signs in only a superuser; anyone else is told to sign
        in through the identity provider (a wrong password fails as ever, telling nothing more)."""
        user = super().authenticate(request, **credentials)
        if user is not None and not settings.LOCAL_PASSWORDS and not user.is_superuser:
            raise PasswordsOff(
                _("Passwords are turned off here: sign in through your organisation's identity provider.")
            )
        return user

    def get_login_stages(self) -> list[str]:
        # The second-factor step knows of one the identity provider asked for (portal/sso/stages.py).
        return [STAGE if stage == ALLAUTH_STAGE else stage for stage in super().get_login_stages()]

    def get_logout_redirect_url(self, request) -> str:
        """Where the person signed in through an identity provider that ends sessions, through it and back to
        the sign-in page; else where allauth sends them."""
        then = request.build_absolute_uri(reverse("account_login"))
        return logout_url(request, then=then) or super().get_logout_redirect_url(request)

    def get_signup_redirect_url(self, request) -> str:
        slug = request.session.pop(JOINED_TENANT_SESSION_KEY, None)
        if slug:
            return reverse("tenant", kwargs={"slug": slug})
        return super().get_signup_redirect_url(request)
