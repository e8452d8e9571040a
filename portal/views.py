"""Tenant pages: home, tenant, project, invitations. Thin: parse, call a service, render."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.templatetags.static import static
from django.utils.translation import gettext as _
from django.views import i18n
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from portal import mail, permissions, selectors, services, shell, tokens
from portal.adapters import INVITATION_SESSION_KEY
from portal.errors import InvalidInput, PortalError
from portal.forms import InvitationForm, MemberRoleForm, PreferencesForm, ProjectForm, TokenForm
from portal.models import Invitation, Preferences, Role

TOKENS_PER_PAGE = 20


def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico whatever a page links (the admin links none): the portal's icon."""
    return HttpResponsePermanentRedirect(static("portal/favicon.svg"))


@login_required
def home(request: HttpRequest) -> HttpResponse:
    memberships = list(selectors.my_memberships(user=request.user))
    if not memberships and (workspace := shell.workspace_for(request.user)):
        return redirect(workspace)  # platform staff without a tenant land on their own workspace
    figures = shell.tenant_figures(request.user, [membership.tenant for membership in memberships])
    rows = [(membership, figures.get(membership.tenant_id, [])) for membership in memberships]
    return render(request, "portal/home.html", {"rows": rows})


def _tenant_page(request, tenant, *, status=200, project_form=None, invitation_form=None):
    my_role = permissions.tenant_role(user=request.user, tenant_id=tenant.pk)
    is_admin = permissions.acts_as_tenant_admin(user=request.user, role=my_role)
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
        "tabs": shell.tenant_tabs(request.user, tenant.slug),
        "sections": shell.tenant_sections(request, tenant),
    }
    return render(request, "portal/tenant.html", context, status=status)


@login_required
def tenant_detail(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = selectors.visible_tenant(user=request.user, slug=slug)
    return _tenant_page(request, tenant)


def _tenant_action(request, slug: str, perform, form_class=None, form_name: str = "") -> HttpResponse:
    """Run one change posted from the tenant page.

    `perform(tenant, data)` calls a service and returns the response of success. A
    form that does not validate, or a service's refusal, shows the tenant page
    again with the reason and the matching 4xx status.
    """
    tenant = selectors.visible_tenant(user=request.user, slug=slug)
    form = form_class(request.POST) if form_class else None
    shown = {form_name: form} if form else {}
    if form is not None and not form.is_valid():
        return _tenant_page(request, tenant, status=400, **shown)
    try:
        return perform(tenant, form.cleaned_data if form else request.POST)
    except PortalError as error:
        if form is not None:
            form.add_error(None, error.message)
        else:
            messages.error(request, error.message)
        return _tenant_page(request, tenant, status=error.status_code, **shown)


@login_required
@require_POST
def project_create(request: HttpRequest, slug: str) -> HttpResponse:
    def perform(tenant, data):
        project = services.create_project(tenant=tenant, actor=request.user, **data)
        messages.success(request, _("Project %(name)s created.") % {"name": project.name})
        return redirect("project", tenant_slug=tenant.slug, slug=project.slug)

    return _tenant_action(request, slug, perform, ProjectForm, "project_form")


@login_required
def project_detail(request: HttpRequest, tenant_slug: str, slug: str) -> HttpResponse:
    project = selectors.visible_project(user=request.user, tenant_slug=tenant_slug, slug=slug)
    context = {
        "project": project,
        "tenant": project.tenant,
        "sections": shell.project_sections(request, project),
    }
    return render(request, "portal/project.html", context)


@login_required
@require_POST
def invitation_create(request: HttpRequest, slug: str) -> HttpResponse:
    def perform(tenant, data):
        invitation = services.invite_member(tenant=tenant, actor=request.user, **data)
        messages.success(request, _("Invitation sent to %(email)s.") % {"email": invitation.email})
        return redirect("tenant", slug=tenant.slug)

    return _tenant_action(request, slug, perform, InvitationForm, "invitation_form")


@login_required
@require_POST
def invitation_revoke(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    def perform(tenant, data):
        invitation = get_object_or_404(tenant.invitations, pk=pk)
        services.revoke_invitation(invitation=invitation, actor=request.user)
        messages.success(request, _("Invitation to %(email)s revoked.") % {"email": invitation.email})
        return redirect("tenant", slug=tenant.slug)

    return _tenant_action(request, slug, perform)


@login_required
@require_POST
def member_role(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    def perform(tenant, data):
        membership = get_object_or_404(tenant.memberships.select_related("user"), pk=pk)
        form = MemberRoleForm(data)
        if not form.is_valid():
            raise InvalidInput(_("Choose one of the roles admin, member or viewer."))
        role = Role(form.cleaned_data["role"])
        services.set_member_role(membership=membership, actor=request.user, role=role)
        messages.success(
            request,
            _("%(user)s is now %(role)s.") % {"user": membership.user.get_username(), "role": role.label},
        )
        return redirect("tenant", slug=tenant.slug)

    return _tenant_action(request, slug, perform)


@login_required
@require_POST
def member_remove(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    def perform(tenant, data):
        membership = get_object_or_404(tenant.memberships.select_related("user"), pk=pk)
        services.remove_member(membership=membership, actor=request.user)
        messages.success(
            request,
            _("%(user)s removed from %(tenant)s.")
            % {"user": membership.user.get_username(), "tenant": tenant.name},
        )
        if membership.user_id == request.user.id:
            return redirect("home")  # they left the tenant
        return redirect("tenant", slug=tenant.slug)

    return _tenant_action(request, slug, perform)


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
    context = {
        "invitation": found,
        "address_verified": found.email.lower() in services.verified_emails(request.user),
    }
    if request.method == "GET":
        return render(request, "portal/invitation.html", context)
    try:
        services.accept_invitation(token=token, user=request.user)
    except PortalError as error:
        messages.error(request, error.message)
        return render(request, "portal/invitation.html", context, status=error.status_code)
    request.session.pop(INVITATION_SESSION_KEY, None)
    messages.success(request, _("Welcome to %(tenant)s.") % {"tenant": found.tenant.name})
    return redirect("tenant", slug=found.tenant.slug)


@login_required
@require_http_methods(["GET", "POST"])
def preferences(request: HttpRequest) -> HttpResponse:
    """Which e-mails a person wants, and in which language."""
    current, _created = Preferences.objects.get_or_create(user=request.user)
    form = PreferencesForm(request.POST if request.method == "POST" else None, instance=current)
    if request.method == "POST" and form.is_valid():
        form.save()
        messages.success(request, _("Your preferences are saved."))
        return redirect("preferences")
    status = 400 if request.method == "POST" else 200
    return render(request, "portal/preferences.html", {"form": form}, status=status)


@require_POST
def set_language(request: HttpRequest) -> HttpResponse:
    """The language menu: Django's own view, and the choice kept as the language of the person's e-mails."""
    response = i18n.set_language(request)
    if request.user.is_authenticated:
        mail.remember_language(request.user, request.POST.get("language", ""))
    return response


@never_cache  # the page may carry a new key: no cache keeps it
@login_required
@require_http_methods(["GET", "POST"])
def api_tokens(request: HttpRequest) -> HttpResponse:
    """A person's API tokens: make one (its key is shown this once), see when each was used, revoke."""
    form = TokenForm(request.POST if request.method == "POST" else None)
    issued = None
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                issued = tokens.issue_token(user=request.user, name=form.cleaned_data["name"])
            except PortalError as error:
                form.add_error("name", error.message)
                status = error.status_code
            else:
                form = TokenForm()
        else:
            status = 400
    stamp = request.user.get_session_auth_hash()
    page = Paginator(selectors.my_tokens(user=request.user), TOKENS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    rows = [(token, token.status_for(stamp)) for token in page]
    context = {"form": form, "issued": issued, "page": page, "rows": rows}
    return render(request, "portal/tokens.html", context, status=status)


@login_required
@require_POST
def api_token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(selectors.my_tokens(user=request.user), pk=pk)
    tokens.revoke_token(token=token, actor=request.user)
    messages.success(request, _("Token %(name)s revoked.") % {"name": token.name})
    return redirect("api-tokens")
