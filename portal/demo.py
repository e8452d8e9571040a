"""Demo data of the portal app: the tenants, projects and people the README lists under *Run it*."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from portal.models import Membership, Project, Role, Tenant
from portal.roles import PlatformRole

DEMO_PASSWORD = "demo-password"

TENANTS = {
    "acme": ("Acme Corporation", [("vision", "Vision research"), ("llm-serving", "LLM serving")]),
    "globex": ("Globex", [("recsys", "Recommender training"), ("analytics", "Analytics notebooks")]),
}
# username → (e-mail, tenant memberships, platform group, superuser)
USERS = {
    "alice": ("alice@acme.example", {"acme": Role.MEMBER}, None, False),
    "bob": ("bob@acme.example", {"acme": Role.ADMIN}, None, False),
    "mallory": ("mallory@globex.example", {"globex": Role.MEMBER}, None, False),
    "carol": ("carol@platform.example", {}, PlatformRole.APPROVER, False),
    "dave": ("dave@platform.example", {}, PlatformRole.FINANCE, False),
    "erin": ("erin@platform.example", {}, PlatformRole.OPERATOR, False),
    "admin": ("admin@platform.example", {}, None, True),
}


def load(stdout) -> None:
    from allauth.account.models import EmailAddress

    tenants = {}
    for slug, (name, projects) in TENANTS.items():
        tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name})
        tenants[slug] = tenant
        for project_slug, project_name in projects:
            Project.objects.get_or_create(
                tenant=tenant,
                slug=project_slug,
                defaults={
                    "name": project_name,
                    "namespace": Project.default_namespace(slug, project_slug),
                },
            )

    User = get_user_model()
    for username, (email, memberships, group, superuser) in USERS.items():
        user, created = User.objects.get_or_create(username=username, defaults={"email": email})
        if created:
            user.set_password(DEMO_PASSWORD)
        user.email = email
        user.is_staff = superuser or group is not None
        user.is_superuser = superuser
        user.save()
        EmailAddress.objects.update_or_create(
            user=user, email=email, defaults={"verified": True, "primary": True}
        )
        if group is not None:
            user.groups.add(Group.objects.get(name=group))
        for tenant_slug, role in memberships.items():
            Membership.objects.update_or_create(
                user=user, tenant=tenants[tenant_slug], defaults={"role": role}
            )
    stdout.write(f"Tenants: {', '.join(TENANTS)}; users: {', '.join(USERS)} (password '{DEMO_PASSWORD}').")
