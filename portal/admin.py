"""Django admin of tenancy: tenants, projects, memberships and invitations."""

from django.contrib import admin
from django.db.models import Count
from django.utils.translation import gettext_lazy as _

from portal.models import Invitation, Membership, Preferences, Project, Tenant

admin.site.site_header = _("GPU Portal administration")
admin.site.site_title = _("GPU Portal")
admin.site.index_title = _("Platform")


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class ProjectInline(admin.TabularInline):
    model = Project
    extra = 0
    fields = ["slug", "name", "namespace"]
    show_change_link = True


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "project_count", "member_count", "created_at"]
    search_fields = ["name", "slug"]
    readonly_fields = ["created_at"]
    inlines = [ProjectInline, MembershipInline]

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
    list_display = ["name", "slug", "tenant", "namespace", "created_by", "created_at"]
    list_filter = ["tenant", "created_at"]
    list_select_related = ["tenant", "created_by"]
    search_fields = ["name", "slug", "namespace", "tenant__name", "tenant__slug"]
    readonly_fields = ["created_at", "created_by"]
    autocomplete_fields = ["tenant"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "user_email", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    list_select_related = ["user", "tenant"]
    search_fields = ["user__username", "user__email", "tenant__name", "tenant__slug"]
    autocomplete_fields = ["user", "tenant"]

    @admin.display(description=_("e-mail"), ordering="user__email")
    def user_email(self, membership):
        return membership.user.email


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
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
    list_display = ["user", "pool_emails"]
    list_filter = ["pool_emails"]
    list_select_related = ["user"]
    search_fields = ["user__username", "user__email"]
