"""Django admin of tenancy: tenants, projects, memberships and invitations; single sign-on's group roles."""

from allauth.account.decorators import secure_admin_login
from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Count
from django.utils.translation import gettext_lazy as _
from django.utils.translation import gettext_noop, ngettext

from portal import audit, tokens
from portal.models import (
    ApiToken,
    GroupRole,
    Invitation,
    Membership,
    Preferences,
    Project,
    ProviderGrant,
    Tenant,
    higher_role,
)
from portal.shell import email_topics

admin.site.site_header = _("GPU Portal administration")
admin.site.site_title = _("GPU Portal")
admin.site.index_title = _("Platform")
# The admin signs in through the portal's own sign-in, so two-factor and the lock-out apply there too.
admin.site.login = secure_admin_login(admin.site.login)


class MembershipForm(forms.ModelForm):
    """A membership as the admin edits it: the role given by hand. The role in force follows (the higher of it
    and the identity provider's), so that saving a membership unchanged gives nobody a higher hand role."""

    class Meta:
        model = Membership
        fields = ["user", "tenant", "hand_role"]

    def clean(self) -> dict:
        data = super().clean()
        if not data.get("hand_role") and not self.instance.provider_role:
            self.add_error("hand_role", _("Choose a role: this person has none from the identity provider."))
        return data

    def save(self, commit: bool = True) -> Membership:
        membership = self.instance
        membership.role = higher_role(membership.hand_role, membership.provider_role)
        return super().save(commit)


class MembershipInline(admin.TabularInline):
    model = Membership
    form = MembershipForm
    extra = 0
    autocomplete_fields = ["user"]
    fields = ["user", "hand_role", "provider_role", "role"]
    readonly_fields = ["provider_role", "role"]


class ProjectInline(admin.TabularInline):
    model = Project
    extra = 0
    fields = ["slug", "name", "namespace"]
    readonly_fields = ["slug", "namespace"]
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # projects are added on their own page, where the namespace rules are checked


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    # Long tables stay quick: 50 rows a page, and one COUNT (the filtered one), not a second of them all.
    list_per_page = 50
    show_full_result_count = False
    list_display = ["name", "slug", "project_count", "member_count", "created_at"]
    search_fields = ["name", "slug"]
    readonly_fields = ["created_at"]
    inlines = [ProjectInline, MembershipInline]

    def get_readonly_fields(self, request, obj=None):
        # Namespaces start with the short name: it cannot change under existing projects.
        return [*self.readonly_fields, "slug"] if obj is not None else self.readonly_fields

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                project_count=Count("projects", distinct=True),
                member_count=Count("memberships", distinct=True),
            )
        )

    @admin.display(description=_("projects"), ordering="project_count")
    def project_count(self, tenant):
        return tenant.project_count

    @admin.display(description=_("members"), ordering="member_count")
    def member_count(self, tenant):
        return tenant.member_count


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_per_page = 50
    show_full_result_count = False
    list_display = ["name", "slug", "tenant", "namespace", "created_by", "created_at"]
    list_filter = ["tenant", "created_at"]
    list_select_related = ["tenant", "created_by"]
    search_fields = ["name", "slug", "namespace", "tenant__name", "tenant__slug"]
    readonly_fields = ["created_at", "created_by"]
    autocomplete_fields = ["tenant"]

    def get_readonly_fields(self, request, obj=None):
        # A project's pools live in its namespace: neither it nor the tenant changes afterwards.
        return [*self.readonly_fields, "tenant", "namespace"] if obj is not None else self.readonly_fields


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_per_page = 50
    show_full_result_count = False
    list_display = ["user", "user_email", "tenant", "role", "provider_role", "created_at"]
    list_filter = ["role", "provider_role", "tenant"]
    list_select_related = ["user", "tenant"]
    search_fields = ["user__username", "user__email", "tenant__name", "tenant__slug"]
    autocomplete_fields = ["user", "tenant"]
    form = MembershipForm
    fields = ["user", "tenant", "hand_role", "provider_role", "role"]
    readonly_fields = ["provider_role", "role"]

    @admin.display(description=_("e-mail"), ordering="user__email")
    def user_email(self, membership):
        return membership.user.email


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_per_page = 50
    show_full_result_count = False
    list_display = [
        "email",
        "tenant",
        "role",
        "status_label",
        "invited_by",
        "created_at",
        "expires_at",
        "sent_at",
    ]
    list_filter = ["role", "tenant", "created_at"]
    list_select_related = ["tenant", "invited_by"]
    search_fields = ["email", "tenant__name", "tenant__slug"]
    readonly_fields = [
        "token",
        "created_at",
        "sent_at",
        "accepted_at",
        "accepted_by",
        "revoked_at",
        "invited_by",
    ]
    autocomplete_fields = ["tenant"]

    @admin.display(description=_("status"))
    def status_label(self, invitation):
        return invitation.status.label


@admin.register(Preferences)
class PreferencesAdmin(admin.ModelAdmin):
    list_per_page = 50
    show_full_result_count = False
    list_display = ["user", "emails_turned_off"]
    list_select_related = ["user"]
    search_fields = ["user__username", "user__email"]
    fields = ["user", "emails_turned_off"]
    readonly_fields = ["user", "emails_turned_off"]  # each person chooses on their notification settings

    def has_add_permission(self, request) -> bool:
        return False  # made when a person first saves their notification settings

    @admin.display(description=_("e-mails turned off"))
    def emails_turned_off(self, preferences):
        labels = {topic.key: topic.label for topic in email_topics()}
        return ", ".join(str(labels.get(key, key)) for key in preferences.emails_off) or "—"


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Platform staff see everyone's API tokens (never their keys) and can revoke them."""

    list_per_page = 50
    show_full_result_count = False
    list_display = ["prefix", "name", "user", "status_label", "created_at", "last_used_at", "expires_at"]
    list_filter = ["revoked_reason", "created_at"]
    list_select_related = ["user"]
    search_fields = ["prefix", "name", "user__username", "user__email"]
    fields = [
        "user",
        "name",
        "prefix",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
        "revoked_reason",
    ]
    readonly_fields = fields
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False  # a token is issued to its owner, who alone sees the key once

    @admin.display(description=_("status"))
    def status_label(self, token: ApiToken) -> str:
        return token.status.label

    @admin.action(description=_("Revoke the selected tokens"), permissions=["change"])
    def revoke(self, request, queryset):
        for token in queryset:
            tokens.revoke_token(token=token, actor=request.user)
        count = len(queryset)
        self.message_user(
            request,
            ngettext("%(count)d token revoked.", "%(count)d tokens revoked.", count) % {"count": count},
            messages.SUCCESS,
        )


@admin.register(GroupRole)
class GroupRoleAdmin(admin.ModelAdmin):
    """Which groups of an identity provider give which roles; each change is audited."""

    list_per_page = 50
    show_full_result_count = False
    list_display = ["group", "role", "provider", "created_at"]
    list_filter = ["provider"]
    search_fields = ["group", "role"]

    def save_model(self, request, obj, form, change) -> None:
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            _record_mapping(request, obj, GROUP_ROLE_SET)

    def delete_model(self, request, obj) -> None:
        with transaction.atomic():
            _record_mapping(request, obj, GROUP_ROLE_REMOVED)
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset) -> None:
        with transaction.atomic():
            for obj in queryset:
                _record_mapping(request, obj, GROUP_ROLE_REMOVED)
            super().delete_queryset(request, queryset)


GROUP_ROLE_SET = gettext_noop("Group %(group)s of %(provider)s gives %(role)s")
GROUP_ROLE_REMOVED = gettext_noop("Group %(group)s of %(provider)s no longer gives %(role)s")


def _record_mapping(request, mapping: GroupRole, summary: str) -> None:
    audit.record(
        "access.group_role",
        summary=summary,
        values={"group": mapping.group, "provider": mapping.provider or "*", "role": mapping.role},
        actor=request.user,
        subject=("group_role", mapping.pk),
    )


@admin.register(ProviderGrant)
class ProviderGrantAdmin(admin.ModelAdmin):
    """Platform roles people hold because their identity provider said so: read only, sign-ins keep them."""

    list_per_page = 50
    show_full_result_count = False
    list_display = ["user", "grant", "provider", "held_by_hand", "granted_at"]
    list_select_related = ["user"]
    list_filter = ["grant", "provider"]
    search_fields = ["user__username", "user__email"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
