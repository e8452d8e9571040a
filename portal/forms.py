"""Forms of the tenant pages; they only parse input, services decide."""

from datetime import date

from allauth.account.adapter import get_adapter as get_account_adapter
from allauth.account.forms import SignupForm as AllauthSignupForm
from allauth.core import context
from allauth.mfa.base import forms as mfa_forms
from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils.translation import gettext_lazy as _

from portal import services, signin
from portal.adapters import INVITATION_SESSION_KEY, JOINED_TENANT_SESSION_KEY, pending_invitation
from portal.errors import PortalError
from portal.models import (
    NAMESPACE_MAX_LENGTH,
    SLUG_MAX_LENGTH,
    Preferences,
    Role,
    Tenant,
    dns_label_validator,
)
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


AUDIT_FIRST_DAY, AUDIT_LAST_DAY = date(1970, 1, 1), date(9998, 12, 31)  # the trail's days, and room around


class _CountedCode:
    """A two-factor code typed here is a guess in the account's one lock-out (`signin.count_code_guess`),
    with failed passwords and the token API's wrong codes: given back when right, kept when wrong."""

    def clean_code(self) -> str:
        guess = signin.count_code_guess(context.request, user=self.user)
        if guess is None:
            raise get_account_adapter().validation_error("too_many_login_attempts")
        code = super().clean_code()  # a wrong code raises here, and its guess stays counted
        guess.rollback()
        return code


class AuthenticateForm(_CountedCode, mfa_forms.AuthenticateForm):
    """The sign-in's two-factor step (MFA_FORMS)."""


class ReauthenticateForm(_CountedCode, mfa_forms.ReauthenticateForm):
    """The two-factor code asked again before a sensitive change (MFA_FORMS)."""


class AuditFilterForm(forms.Form):
    """The audit page's filters; each refuses what it cannot mean, and the page answers 400 saying why."""

    action = forms.RegexField(
        label=_("Action"),
        required=False,
        max_length=40,
        regex=r"^[a-z_]+(\.[a-z_]+)?$",
        error_messages={
            "invalid": _("An action is a code such as invoice.issued, or its family, e.g. invoice.")
        },
        help_text=_("A code such as request.approved, or a family such as request."),
        widget=forms.TextInput(attrs={"list": "audit-actions"}),
    )
    tenant = forms.CharField(label=_("Tenant"), required=False, max_length=SLUG_MAX_LENGTH)
    actor = forms.CharField(label=_("Who"), required=False, max_length=150)
    since = forms.DateField(label=_("From"), required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(label=_("Until"), required=False, widget=forms.DateInput(attrs={"type": "date"}))
    q = forms.CharField(label=_("Summary contains"), required=False, max_length=200)

    def clean_tenant(self):
        slug = self.cleaned_data["tenant"].strip()
        if slug and not Tenant.objects.filter(slug=slug).exists():
            raise forms.ValidationError(_("No tenant has the short name %(slug)s."), params={"slug": slug})
        return slug

    def clean_actor(self):
        username = self.cleaned_data["actor"].strip()
        if username and not get_user_model().objects.filter(username=username).exists():
            raise forms.ValidationError(_("No one has the user name %(name)s."), params={"name": username})
        return username

    def clean(self):
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        for name, day in (("since", since), ("until", until)):
            if day and not AUDIT_FIRST_DAY <= day <= AUDIT_LAST_DAY:
                self.add_error(name, _("Give a day from 1970 to 9998."))
                return data
        if since and until and since > until:
            raise forms.ValidationError(_("The date range ends before it starts."))
        return data
