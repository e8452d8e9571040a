"""URLs of the whole site: pages, accounts, admin, the API and its documentation."""

from importlib import import_module

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from portal import api, audit_views, errors, metrics, shell, views
from portal.sso import provider as sso

# One router answers /api/v1/ with every app's collections; each app brings its own routes.
router = DefaultRouter(trailing_slash=True)
router.register("tenants", api.TenantViewSet, basename="tenant")
router.register("projects", api.ProjectViewSet, basename="project")
api_v1 = [path("auth/token/", api.TokenView.as_view(), name="api-token")]
app_pages = []
for plugin in shell.plugins():
    if plugin.api:
        app_api = import_module(plugin.api)
        router.registry.extend(app_api.router.registry)
        api_v1 += app_api.urlpatterns
    if plugin.urls:
        app_pages.append(path("", include(plugin.urls)))
api_v1.append(path("", include(router.urls)))

urlpatterns = [
    path("", views.home, name="home"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("metrics", metrics.metrics, name="metrics"),
    path("t/<slug:slug>/", views.tenant_detail, name="tenant"),
    path("t/<slug:slug>/projects/new/", views.project_create, name="project-create"),
    path("t/<slug:tenant_slug>/p/<slug:slug>/", views.project_detail, name="project"),
    path("t/<slug:slug>/invitations/new/", views.invitation_create, name="invitation-create"),
    path("t/<slug:slug>/invitations/<int:pk>/revoke/", views.invitation_revoke, name="invitation-revoke"),
    path("t/<slug:slug>/members/<int:pk>/role/", views.member_role, name="member-role"),
    path("t/<slug:slug>/members/<int:pk>/remove/", views.member_remove, name="member-remove"),
    path("invitations/<slug:token>/", views.invitation, name="invitation"),  # token_urlsafe alphabet
    *app_pages,
    path("audit/", audit_views.audit_log, name="audit"),
    path("accounts/notifications/", views.preferences, name="preferences"),
    path("accounts/tokens/", views.api_tokens, name="api-tokens"),
    path("accounts/tokens/<int:pk>/revoke/", views.api_token_revoke, name="api-token-revoke"),
    # Sign-in through an identity provider, with every check of its ID token (portal/sso/provider.py), in
    # place of allauth's own views at the same addresses.
    path("accounts/oidc/<str:provider_id>/login/", sso.login, name="openid_connect_login"),
    path("accounts/oidc/<str:provider_id>/login/callback/", sso.callback, name="openid_connect_callback"),
    path("accounts/", include("allauth.urls")),
    path("i18n/setlang/", views.set_language, name="set_language"),
    path("admin/", admin.site.urls),
    path("api/v1/", include((api_v1, "api"), namespace="v1")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its start-up script from a URL: the CSP allows no inline script.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="swagger-ui"),
    # Unknown API addresses answer JSON, in DEBUG too.
    re_path(r"^api/", errors.api_not_found),
]

handler400 = "portal.errors.bad_request"
handler403 = "portal.errors.permission_denied"
handler404 = "portal.errors.page_not_found"
handler500 = "portal.errors.server_error"
