"""How sign-up works here: by invitation unless the portal is configured open.

An invitation link puts its token in the session and marks its address as
verified (the invitee has just proved they read that inbox); signing up with
that address then joins the tenant straight away.
"""

from __future__ import annotations

from allauth.account.adapter import DefaultAccountAdapter
from django.conf import settings
from django.urls import reverse

from portal.errors import PortalError
from portal.models import Invitation

INVITATION_SESSION_KEY = "portal_invitation_token"


def pending_invitation(request) -> Invitation | None:
    token = request.session.get(INVITATION_SESSION_KEY)
    if not token:
        return None
    invitation = Invitation.objects.select_related("tenant").filter(token=token).first()
    return invitation if invitation and invitation.is_pending else None


class AccountAdapter(DefaultAccountAdapter):
    def is_open_for_signup(self, request) -> bool:
        return settings.PORTAL_OPEN_SIGNUP or pending_invitation(request) is not None

    def save_user(self, request, user, form, commit=True):
        from portal.services import accept_invitation

        user = super().save_user(request, user, form, commit=commit)
        invitation = pending_invitation(request)
        if commit and invitation and invitation.email.lower() == (user.email or "").lower():
            try:
                accept_invitation(token=invitation.token, user=user)
            except PortalError:
                pass  # the invitation page explains what went wrong when the user opens it again
            else:
                request.session.pop(INVITATION_SESSION_KEY, None)
                request.session["portal_joined_tenant"] = invitation.tenant.slug
        return user

    def get_signup_redirect_url(self, request) -> str:
        slug = request.session.pop("portal_joined_tenant", None)
        if slug:
            return reverse("tenant", kwargs={"slug": slug})
        return super().get_signup_redirect_url(request)
