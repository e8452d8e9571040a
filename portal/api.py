"""REST API of tenancy: auth tokens, tenants and projects (`/api/v1/`)."""

from __future__ import annotations

import hashlib

from django.db import transaction
from django.utils.module_loading import import_string
from django.utils.translation import gettext_lazy as _
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from portal import permissions, selectors, services, shell, signin, tokens
from portal.adapters import login_attempts_key
from portal.authentication import TokenAuthentication
from portal.errors import InvalidInput
from portal.models import (
    NAMESPACE_MAX_LENGTH,
    SLUG_MAX_LENGTH,
    Project,
    Tenant,
    dns_label_validator,
)


class TokenRequestSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=254, help_text=_("User name or e-mail address."))
    password = serializers.CharField(max_length=4096, trim_whitespace=False, style={"input_type": "password"})
    code = serializers.CharField(
        max_length=16, required=False, help_text=_("Current two-factor code, for users who turned it on.")
    )
    name = serializers.CharField(
        max_length=100,
        required=False,
        allow_blank=True,
        help_text=_("A label for the token, e.g. ci-runner."),
    )


class TokenResponseSerializer(serializers.Serializer):
    token = serializers.CharField(help_text=_("The key: send it as `Authorization: Token <key>`."))
    name = serializers.CharField()
    expires_at = serializers.DateTimeField(allow_null=True)


class ClientAddressThrottle(SimpleRateThrottle):
    """Sign-in attempts per client address (REMOTE_ADDR, or X-Forwarded-For behind trusted proxies)."""

    scope = "auth"

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class AccountThrottle(SimpleRateThrottle):
    """Sign-in attempts per account named, from anywhere: rotating addresses does not help."""

    scope = "auth-account"

    def get_cache_key(self, request, view) -> str | None:
        login = request.data.get("username") if hasattr(request.data, "get") else None
        if not isinstance(login, str) or not login.strip() or len(login) > 254:
            return None  # the serializer refuses it before any password is checked
        # Hashed: a login may hold any character, and a cache key should be short plain text.
        ident = hashlib.sha256(login_attempts_key(login).encode()).hexdigest()
        return self.cache_format % {"scope": self.scope, "ident": ident}


class TokenView(APIView):
    """Exchange a user name (or e-mail) and password for a new API token; DELETE revokes the caller's.

    Failed tries count into the same per-account lock-out as the sign-in form, and
    attempts are throttled per client address and per account.
    """

    def _method(self) -> str | None:
        return getattr(self.request, "method", None)  # None while the OpenAPI schema is generated

    def get_authenticators(self):
        return [TokenAuthentication()] if self._method() != "POST" else []

    def get_permissions(self):
        return [IsAuthenticated()] if self._method() == "DELETE" else [AllowAny()]

    def get_throttles(self):
        return [ClientAddressThrottle(), AccountThrottle()] if self._method() == "POST" else []

    @extend_schema(
        request=TokenRequestSerializer,
        responses={
            200: TokenResponseSerializer,
            400: OpenApiResponse(
                description=_(
                    "The user name, password or two-factor code is wrong (one answer for all three, and a "
                    "failed attempt in the account's lock-out), or a field is missing or not valid."
                )
            ),
            403: OpenApiResponse(
                description=_("Platform staff must turn on two-factor authentication before using the API.")
            ),
            429: OpenApiResponse(
                description=_("Too many failed attempts for this account or from this address: wait.")
            ),
        },
    )
    def post(self, request):
        serializer = TokenRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        user = signin.check_credentials(
            request._request, login=data["username"], password=data["password"], code=data.get("code", "")
        )
        issued = tokens.issue_token(user=user, name=data.get("name", ""))
        return Response(
            {"token": issued.key, "name": issued.token.name, "expires_at": issued.token.expires_at}
        )

    @extend_schema(request=None, responses={204: None, 401: OpenApiResponse()})
    def delete(self, request):
        tokens.revoke_token(token=request.auth, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TenantSerializer(serializers.ModelSerializer):
    """A tenant, with the settings the apps keep of it (portal.shell.TenantSetting) after its own fields."""

    role = serializers.SerializerMethodField(help_text=_("Your role in the tenant; null for platform staff."))

    class Meta:
        model = Tenant
        fields = ["id", "slug", "name", "role"]

    def get_role(self, tenant: Tenant) -> str | None:
        return self.context["roles"].get(tenant.id)

    def to_representation(self, tenant: Tenant) -> dict:
        found = super().to_representation(tenant)
        if "settings" not in self.context:  # read once for the tenants answered together (a page of them)
            listed = self.parent.instance if self.parent is not None else [tenant]
            self.context["settings"] = {
                name: import_string(setting.read)(listed) for name, setting in shell.tenant_settings().items()
            }
        for name, values in self.context["settings"].items():
            found[name] = values.get(tenant.pk)
        return found


SETTING_FIELDS = {bool: serializers.BooleanField, int: serializers.IntegerField, str: serializers.CharField}


def tenant_settings_serializer() -> type[serializers.Serializer]:
    """The body of a change of tenant settings: each app's, each optional; anything else is refused."""
    fields = {
        name: SETTING_FIELDS[setting.kind](
            required=False, allow_null=setting.nullable, help_text=setting.help_text
        )
        for name, setting in shell.tenant_settings().items()
    }
    return type("TenantSettingsSerializer", (serializers.Serializer,), fields)


class TenantViewSet(mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Tenants you belong to (platform staff: all). A change sets the apps' settings of a tenant, each
    through its app's service, which says who may."""

    serializer_class = TenantSerializer
    lookup_field = "slug"
    http_method_names = ["get", "patch", "head", "options"]

    def get_queryset(self):
        return Tenant.objects.visible_to(self.request.user).order_by("name")

    def get_serializer_context(self):
        context = super().get_serializer_context()
        context["roles"] = permissions.tenant_roles(user=self.request.user)
        return context

    @extend_schema(request=tenant_settings_serializer(), responses=TenantSerializer)
    def partial_update(self, request, *args, **kwargs):
        tenant = self.get_object()
        known = shell.tenant_settings()
        unknown = sorted(set(request.data) - set(known)) if isinstance(request.data, dict) else []
        if unknown:
            raise InvalidInput(
                _("A tenant has no setting %(names)s; its settings: %(known)s.")
                % {"names": ", ".join(unknown), "known": ", ".join(known) or _("none")}
            )
        body = tenant_settings_serializer()(data=request.data)
        body.is_valid(raise_exception=True)
        with transaction.atomic():
            for name, value in body.validated_data.items():
                import_string(known[name].write)(actor=request.user, tenant=tenant, value=value)
        return Response(self.get_serializer(self.get_queryset().get(pk=tenant.pk)).data)


class ProjectSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", queryset=Tenant.objects.none())
    slug = serializers.CharField(max_length=SLUG_MAX_LENGTH, validators=[dns_label_validator])
    namespace = serializers.CharField(
        max_length=NAMESPACE_MAX_LENGTH,
        required=False,
        allow_blank=True,
        validators=[dns_label_validator],
        help_text=_("Defaults to the tenant and project slugs joined by a hyphen, e.g. acme-vision."),
    )

    class Meta:
        model = Project
        fields = ["id", "slug", "name", "tenant", "namespace", "description", "created_at"]
        read_only_fields = ["id", "created_at"]
        validators = []  # uniqueness is the service's to check: a clash is a 409, not a 400
        extra_kwargs = {"description": {"required": False}}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None:
            # A tenant the user cannot see is reported as not existing.
            self.fields["tenant"].queryset = Tenant.objects.visible_to(request.user)


class ProjectViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Projects of the tenants you belong to; tenant admins create them."""

    serializer_class = ProjectSerializer

    def get_queryset(self):
        return selectors.visible_projects(user=self.request.user)

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        project = services.create_project(
            tenant=data["tenant"],
            actor=request.user,
            slug=data["slug"],
            name=data["name"],
            namespace=data.get("namespace", ""),
            description=data.get("description", ""),
        )
        return Response(self.get_serializer(project).data, status=status.HTTP_201_CREATED)
