"""Why a sign-in through an identity provider was refused, in words the person can act on."""

from __future__ import annotations

from allauth.socialaccount.providers.oauth2.client import OAuth2Error
from django.utils.translation import gettext_lazy as _


class SignInRefused(OAuth2Error):
    """A sign-in refused for a reason the person is told (`message`); nothing was created or changed."""

    def __init__(self, message) -> None:
        super().__init__(str(message))
        self.message = message


WRONG_ISSUER = _("The identity provider's answer came from another issuer than the one this portal trusts.")
WRONG_AUDIENCE = _("The identity provider's answer was meant for another application.")
EXPIRED = _("The identity provider's answer has expired. Sign in again.")
BAD_SIGNATURE = _("The identity provider's answer is not signed by the provider's keys.")
BAD_TOKEN = _("The identity provider's answer could not be read as a valid ID token.")
REPLAYED = _("This sign-in was already used, or it was not started here. Sign in again.")
GROUPS_NOT_A_LIST = _(
    "The identity provider sent its groups in a form the portal cannot read (a list of names is expected). "
    "Ask your administrator to check the provider's group claim."
)
UNVERIFIED_EMAIL = _(
    "An account with the address %(email)s already exists here, and the identity provider does not say the "
    "address is verified, so the portal cannot tell that it is yours. Sign in with your password, or ask the "
    "provider's administrator to verify the address."
)
UNVERIFIED_HERE = _(
    "An account with the address %(email)s already exists here, but its holder never verified it in the "
    "portal, so it cannot be joined to your sign-in. Ask a platform administrator to look at that account."
)
UNREACHABLE = _("The identity provider cannot be reached just now. Try again in a moment.")
PROVIDER_REFUSED = _(
    "The identity provider did not complete the sign-in. Try again, or ask its administrator."
)
