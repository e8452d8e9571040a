"""Tenant pages: home, tenant, project, invitations. Thin: parse, call a service, render."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods, require_POST

from portal import selectors, services
from portal.adapters import INVITATION_SESSION_KEY
from portal.errors import InvalidInput, PortalError
from portal.forms import InvitationForm, MemberRoleForm, ProjectForm
from portal.models import Invitation, Role


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return render(request, "portal/home.html", {"memberships": selectors.my_memberships(user=request.user)})


def _tenant_page(request, tenant, *, status=200, project_form=None, invitation_form=None):
    my_role = services.role_in(user=request.user, tenant=tenant)
    is_admin = my_role == Role.ADMIN or request.user.is_superuser
    context = {
        "tenant": tenant,
        "my_role": my_role,
        "is_admin": is_admin,
        "projects": selectors.tenant_projects(tenant=tenant),
        "members": selectors.tenant_members(tenant=tenant),
        "invitations": selectors.tenant_open_invitations(tenant=tenant) if is_admin else [],
        "project_form": project_form or ProjectForm(),
        "invitation_form": invitation_form or InvitationForm(),
        "roles": Role.choices,
    }
    return render(request, "portal/tenant.html", context, status=status)


@login_required
def tenant_detail(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = selectors.visible_tenant(user=request.user, slug=slug)
    return _tenant_page(request, tenant)


def _refuse(request, error: PortalError, form=None):
    """Show a domain refusal on the page it came from, with the error's status."""
    if form is not None:
        form.add_error(None, error.message)
    else:
        messages.error(request, error.message)
    return error.status_code


@login_required
@require_POST
def project_create(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = selectors.visible_tenant(user=request.user, slug=slug)
    form = ProjectForm(request.POST)
    if not form.is_valid():
        return _tenant_page(request, tenant, status=400, project_form=form)
    try:
        project = services.create_project(tenant=tenant, actor=request.user, **form.cleaned_data)
    except PortalError as error:
        status = _refuse(request, error, form)
        return _tenant_page(request, tenant, status=status, project_form=form)
    messages.success(request, _("Project %(name)s created.") % {"name": project.name})
    return redirect("project", tenant_slug=tenant.slug, slug=project.slug)


@login_required
def project_detail(request: HttpRequest, tenant_slug: str, slug: str) -> HttpResponse:
    project = selectors.visible_project(user=request.user, tenant_slug=tenant_slug, slug=slug)
    return render(request, "portal/project.html", {"project": project, "tenant": project.tenant})


@login_required
@require_POST
def invitation_create(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = selectors.visible_tenant(user=request.user, slug=slug)
    form = InvitationForm(request.POST)
    if not form.is_valid():
        return _tenant_page(request, tenant, status=400, invitation_form=form)
    try:
        invitation = services.invite_member(tenant=tenant, actor=request.user, **form.cleaned_data)
    except PortalError as error:
        status = _refuse(request, error, form)
        return _tenant_page(request, tenant, status=status, invitation_form=form)
    messages.success(request, _("Invitation sent to %(email)s.") % {"email": invitation.email})
    return redirect("tenant", slug=tenant.slug)


@login_required
@require_POST
def invitation_revoke(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    tenant = selectors.visible_tenant(user=request.user, slug=slug)
    invitation = get_object_or_404(tenant.invitations, pk=pk)
    try:
        services.revoke_invitation(invitation=invitation, actor=request.user)
    except PortalError as error:
        return _tenant_page(request, tenant, status=_refuse(request, error))
    messages.success(request, _("Invitation to %(email)s revoked.") % {"email": invitation.email})
    return redirect("tenant", slug=tenant.slug)


@login_required
@require_POST
def member_role(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    tenant = selectors.visible_tenant(user=request.user, slug=slug)
    membership = get_object_or_404(tenant.memberships.select_related("user"), pk=pk)
    form = MemberRoleForm(request.POST)
    try:
        if not form.is_valid():
            raise InvalidInput(_("Choose one of the roles admin, member or viewer."))
        services.set_member_role(membership=membership, actor=request.user, role=form.cleaned_data["role"])
    except PortalError as error:
        return _tenant_page(request, tenant, status=_refuse(request, error))
    messages.success(
        request,
        _("%(user)s is now %(role)s.")
        % {
            "user": membership.user.get_username(),
            "role": Role(form.cleaned_data["role"]).label,
        },
    )
    return redirect("tenant", slug=tenant.slug)


@login_required
@require_POST
def member_remove(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    tenant = selectors.visible_tenant(user=request.user, slug=slug)
    membership = get_object_or_404(tenant.memberships.select_related("user"), pk=pk)
    try:
        services.remove_member(membership=membership, actor=request.user)
    except PortalError as error:
        return _tenant_page(request, tenant, status=_refuse(request, error))
    messages.success(
        request,
        _("%(user)s removed from %(tenant)s.")
        % {
            "user": membership.user.get_username(),
            "tenant": tenant.name,
        },
    )
    if membership.user_id == request.user.id:
        return redirect("home")
    return redirect("tenant", slug=tenant.slug)


@require_http_methods(["GET", "POST"])
def invitation(request: HttpRequest, token: str) -> HttpResponse:
    """The link in an invitation e-mail: sign up or sign in, then join the tenant."""
    from allauth.account.adapter import get_adapter

    found = Invitation.objects.select_related("tenant", "invited_by").filter(token=token).first()
    if found is None:
        return render(request, "portal/invitation.html", {"invitation": None}, status=404)
    if not found.is_pending:
        return render(request, "portal/invitation.html", {"invitation": found}, status=410)
    if not request.user.is_authenticated:
        request.session[INVITATION_SESSION_KEY] = token
        get_adapter(request).stash_verified_email(request, found.email)
        return render(request, "portal/invitation.html", {"invitation": found})
    if request.method == "GET":
        return render(request, "portal/invitation.html", {"invitation": found})
    try:
        services.accept_invitation(token=token, user=request.user)
    except PortalError as error:
        messages.error(request, error.message)
        return render(request, "portal/invitation.html", {"invitation": found}, status=error.status_code)
    request.session.pop(INVITATION_SESSION_KEY, None)
    messages.success(request, _("Welcome to %(tenant)s.") % {"tenant": found.tenant.name})
    return redirect("tenant", slug=found.tenant.slug)
