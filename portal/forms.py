"""Forms of the tenant pages; they only parse input, services decide."""

from django import forms
from django.utils.translation import gettext_lazy as _

from portal.models import NAMESPACE_MAX_LENGTH, SLUG_MAX_LENGTH, Preferences, Role, dns_label_validator


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
        help_text=_("Leave empty to use the tenant and project short names, e.g. acme-vision."),
    )
    description = forms.CharField(
        label=_("Description"), max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2})
    )


class InvitationForm(forms.Form):
    email = forms.EmailField(label=_("E-mail"), max_length=254)
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices, initial=Role.MEMBER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices)


class PreferencesForm(forms.ModelForm):
    class Meta:
        model = Preferences
        fields = ["pool_emails"]
