"""Factories of people and tenancy: `UserFactory(is_staff=True)`, `ProjectFactory(tenant=acme)`,
`MembershipFactory(role=Role.ADMIN)`; and the TOTP a staff account signs in with."""

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password

from portal.models import Invitation, Membership, Project, Role, Tenant

PASSWORD = "test-password-123"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ["username"]
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    # Hashed before the row is written, so that it is written once (`password="..."` is hashed too).
    password = factory.Transformer(PASSWORD, transform=make_password)

    @factory.post_generation
    def verified_email(obj, create, extracted, **kwargs):
        """`verified_email=True`: the person has proved their address, as allauth records it."""
        if create and extracted:
            from allauth.account.models import EmailAddress

            EmailAddress.objects.update_or_create(
                user=obj, email=obj.email.lower(), defaults={"verified": True, "primary": True}
            )

    @factory.post_generation
    def totp(obj, create, extracted, **kwargs):
        """Platform staff have TOTP on, as the portal requires; `totp=False` makes one who has not."""
        from allauth.mfa.models import Authenticator

        wanted = extracted if extracted is not None else (obj.is_staff or obj.is_superuser)
        if create and wanted and not Authenticator.objects.filter(user=obj, type="totp").exists():
            enable_totp(obj)


def enable_totp(user) -> str:
    """Turn TOTP on for `user`, as the set-up page would; returns the secret."""
    from allauth.mfa.totp.internal.auth import TOTP, generate_totp_secret

    secret = generate_totp_secret()
    TOTP.activate(user, secret)
    return secret


def totp_code(secret: str, *, periods_ago: int = 0) -> str:
    """The code an authenticator app shows now (or that many periods ago) for `secret`."""
    import time

    from allauth.mfa import app_settings
    from allauth.mfa.totp.internal.auth import format_hotp_value, hotp_value

    counter = int(time.time()) // app_settings.TOTP_PERIOD - periods_ago
    return format_hotp_value(hotp_value(secret, counter))


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        django_get_or_create = ["slug"]

    slug = factory.Sequence(lambda n: f"tenant{n}")
    name = factory.LazyAttribute(lambda t: t.slug.title())


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    tenant = factory.SubFactory(TenantFactory)
    slug = factory.Sequence(lambda n: f"project{n}")
    name = factory.LazyAttribute(lambda p: p.slug.title())
    namespace = factory.LazyAttribute(lambda p: Project.default_namespace(p.tenant.slug, p.slug))


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)
    role = Role.MEMBER


class InvitationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Invitation

    tenant = factory.SubFactory(TenantFactory)
    email = factory.Sequence(lambda n: f"invitee{n}@example.com")
    role = Role.MEMBER
    invited_by = factory.SubFactory(UserFactory)
