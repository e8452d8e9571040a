"""REST API of tenancy: auth tokens, tenants and projects (`/api/v1/`)."""

from __future__ import annotations

from allauth.mfa.models import Authenticator
from allauth.mfa.totp.internal.auth import TOTP
from django.contrib.auth import authenticate, get_user_model
from django.utils.translation import gettext_lazy as _
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.authtoken.models import Token
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from portal import selectors, services
from portal.models import (
    NAMESPACE_MAX_LENGTH,
    SLUG_MAX_LENGTH,
    Membership,
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

    def validate(self, attrs):
        login = attrs["username"]
        if "@" in login:
            match = get_user_model().objects.filter(email__iexact=login).first()
            login = match.get_username() if match else login
        user = authenticate(self.context["request"], username=login, password=attrs["password"])
        if user is None:
            raise serializers.ValidationError(
                _("Unable to sign in with these credentials."), code="authorization"
            )
        totp = Authenticator.objects.filter(user=user, type=Authenticator.Type.TOTP).first()
        if totp is not None:
            code = attrs.get("code")
            if not code:
                raise serializers.ValidationError(
                    {"code": _("This account uses two-factor authentication: send the current code.")}
                )
            if not TOTP(totp).validate_code(code):
                raise serializers.ValidationError({"code": _("The two-factor code is not valid.")})
        attrs["user"] = user
        return attrs


class TokenView(APIView):
    """Exchange a user name (or e-mail) and password for an API token."""

    permission_classes = [AllowAny]
    authentication_classes = []
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"

    @extend_schema(
        request=TokenRequestSerializer,
        responses={200: inline_serializer("TokenResponse", {"token": serializers.CharField()})},
    )
    def post(self, request):
        serializer = TokenRequestSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        token, _created = Token.objects.get_or_create(user=serializer.validated_data["user"])
        return Response({"token": token.key})


class TenantSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField(help_text=_("Your role in the tenant; null for platform staff."))

    class Meta:
        model = Tenant
        fields = ["id", "slug", "name", "role"]

    def get_role(self, tenant: Tenant) -> str | None:
        return self.context["roles"].get(tenant.id)


class TenantViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = TenantSerializer

    def get_queryset(self):
        return Tenant.objects.visible_to(self.request.user).order_by("name")

    def get_serializer_context(self):
        context = super().get_serializer_context()
        context["roles"] = dict(
            Membership.objects.filter(user=self.request.user).values_list("tenant_id", "role")
        )
        return context


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
