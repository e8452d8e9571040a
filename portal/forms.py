"""Forms of the tenant pages; they only parse input, services decide."""

from allauth.account.forms import SignupForm as AllauthSignupForm
from allauth.core import context
from django import forms
from django.conf import settings
from django.utils.translation import gettext_lazy as _

from portal import services
from portal.adapters import INVITATION_SESSION_KEY, JOINED_TENANT_SESSION_KEY, pending_invitation
from portal.errors import PortalError
from portal.models import NAMESPACE_MAX_LENGTH, SLUG_MAX_LENGTH, Preferences, Role, dns_label_validator
from portal.shell import email_topics


class ProjectForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=100)
    slug = forms.CharField(
        label=_("Short name"),
        max_length=SLUG_MAX_LENGTH,
        validators=[dns_label_validator],
        help_text=_("Lower-case letters, digits and hyphens, e.g. vision-research."),
    )
    namespace = forms.CharField(
        label=_("Kubernetes namespace"),
        max_length=NAMESPACE_MAX_LENGTH,
        required=False,
        validators=[dns_label_validator],
        help_text=_(
            "Starts with the tenant's short name and a hyphen; leave empty for the tenant and "
            "project short names, e.g. acme-vision."
        ),
    )
    description = forms.CharField(
        label=_("Description"), max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2})
    )


class InvitationForm(forms.Form):
    email = forms.EmailField(label=_("E-mail"), max_length=254)
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices, initial=Role.MEMBER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices)


class TokenForm(forms.Form):
    name = forms.CharField(
        label=_("Name"),
        max_length=100,
        help_text=_("What the token is for, e.g. ci-runner or a notebook."),
    )


class PreferencesForm(forms.Form):
    """The language of a person's e-mails, and one box per e-mail topic that an app declares, ticked when
    the person wants those e-mails."""

    def __init__(self, data=None, *, instance: Preferences):
        super().__init__(data)
        self.instance = instance
        self.fields["language"] = forms.ChoiceField(
            label=_("Language of e-mails"),
            choices=settings.LANGUAGES,
            initial=instance.language or settings.LANGUAGE_CODE,
            required=False,  # left out: unchanged
            help_text=_("Choosing a language in the menu at the top changes it too."),
        )
        for topic in email_topics():
            self.fields[f"email_{topic.key}"] = forms.BooleanField(
                label=topic.label,
                help_text=topic.help_text,
                required=False,
                initial=topic.key not in instance.emails_off,
            )

    @property
    def has_topics(self) -> bool:
        return any(name.startswith("email_") for name in self.fields)

    def save(self) -> Preferences:
        topics = email_topics()
        known = {topic.key for topic in topics}
        kept = [key for key in self.instance.emails_off if key not in known]  # of an app no longer installed
        off = [topic.key for topic in topics if not self.cleaned_data[f"email_{topic.key}"]]
        self.instance.emails_off = kept + off
        self.instance.language = self.cleaned_data["language"] or self.instance.language
        self.instance.save(update_fields=["emails_off", "language"])
        return self.instance


class SignupForm(AllauthSignupForm):
    """Sign-up: through an invitation, only with the invited address, which it verifies."""

    def clean_email(self) -> str:
        email = super().clean_email()
        invitation = pending_invitation(context.request)
        if invitation is not None and not settings.PORTAL_OPEN_SIGNUP and email != invitation.email.lower():
            raise forms.ValidationError(
                _("This invitation is for %(email)s: sign up with that address."),
                code="not_invited",
                params={"email": invitation.email},
            )
        return email

    def validate_unique_email(self, value: str) -> str:
        invitation = pending_invitation(context.request)
        invited = invitation is not None and value == invitation.email.lower()
        if invited and not services.verified_owner_exists(email=value):
            # Only unverified claims stand in the way: the invitee, who holds the link, wins.
            self.account_already_exists = False
            return value
        return super().validate_unique_email(value)

    def save(self, request):
        invitation = pending_invitation(request)
        invited = invitation is not None and self.cleaned_data["email"] == invitation.email.lower()
        if invited:
            services.release_unverified_claims(email=invitation.email)
        user = super().save(request)
        if invited:
            try:
                services.accept_invitation(token=invitation.token, user=user)
            except PortalError:
                pass  # the invitation page explains what went wrong when the person opens it again
            else:
                request.session.pop(INVITATION_SESSION_KEY, None)
                request.session[JOINED_TENANT_SESSION_KEY] = invitation.tenant.slug
        return user
