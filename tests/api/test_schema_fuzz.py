"""The API under a fuzzer: schemathesis generates requests from the portal's own OpenAPI schema
(`/api/schema/`) and sends them in-process to the WSGI app, as each role, with every check on: no 5xx,
every status code, content type, header and body as the schema documents them, bad input refused, good
input accepted, no endpoint ignoring its authentication.

Deterministic (derandomized, a bounded number of examples per operation) so that CI sees the same
requests every run. Seeded data gives the endpoints objects to act on: a generated `{id}` is mapped onto
the ids of seeded objects (the caller's own, another tenant's, none) most of the time, and a well-formed
cluster or purpose (GPU group) name onto the seeded ones, as a client reads them from GET /api/v1/clusters/.
Strings may hold NUL: the schema says where the API refuses it (everywhere).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections
from hypothesis import HealthCheck, settings

from monitoring.ingest import tokens as agents
from pools.models import Cluster, GpuCapacity, NodeCapacity, RequestState
from pools.services.inventory import sync_inventory
from portal import tokens
from portal.models import DNS_LABEL_PATTERN
from tests.api.openapi import served_schema
from tests.factories import (
    ClusterFactory,
    GpuGroupFactory,
    InvoiceFactory,
    PoolFactory,
    PoolRequestFactory,
    PriceFactory,
)

EXAMPLES_PER_OPERATION = 4
FLEET = [
    ("h200", 1, "H200-141GB", [{"1g.18gb": 7}, None]),
    ("h100", 1, "H100-80GB", [None, None]),
]
GROUPS = {"h200-1": "training", "h100-1": "inference"}
# Input that names objects (a tenant, project, spec, or a person by name and password) is schema-valid
# whatever it names, and the API answers an unknown one with a 400 on that field (documented).
NAMES_OBJECTS = [
    {"include-path": "/api/v1/auth/token/", "include-method": "POST"},
    {"include-path": "/api/v1/projects/", "include-method": "POST"},
    # Its project, specs and counts (against the fleet) are data too; its purpose and cluster are aimed.
    {"include-path": "/api/v1/pool-requests/", "include-method": "POST"},
    # A budget names a tenant (another tenant's answers 404), a project of it and the billing currency.
    {"include-path": "/api/v1/budgets/", "include-method": "PUT"},
    # A node agent's readings name a host and GPUs, at a time the portal must still take.
    {"include-path": "/api/v1/monitoring/samples/", "include-method": "POST"},
]


def config(*, phase: str) -> schemathesis.Config:
    """Every check on, for one generation phase: `fuzzing` (examples drawn from each operation's schemas,
    valid and not) or `coverage` (a fixed set of boundary values of each parameter and field)."""
    return schemathesis.Config.from_dict(
        {
            "generation": {
                "mode": "all",
                "max-examples": EXAMPLES_PER_OPERATION,
                "deterministic": True,
            },
            "phases": {
                "examples": {"enabled": phase == "fuzzing"},
                "fuzzing": {"enabled": phase == "fuzzing"},
                "coverage": {"enabled": phase == "coverage"},
            },
            "checks": {"enabled": True},
            "operations": [
                {
                    **where,
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "400", "401", "403", "404", "409", "429"]
                        }
                    },
                }
                for where in NAMES_OBJECTS
            ],
        }
    )


@pytest.fixture(autouse=True)
def _instant_mig(settings):
    settings.SIMULATED_MIG_APPLY_SECONDS = 0


@pytest.fixture
def world(tenancy, staff_user):
    """Objects of both tenants for every endpoint to act on, and the people of every role."""
    cluster = ClusterFactory(name="sim", fleet=FLEET)
    sync_inventory(cluster=cluster)
    for node, group in GROUPS.items():  # a cluster with groups takes a purpose only among them
        cluster.nodes.filter(name=node).update(group=GpuGroupFactory(cluster=cluster, name=group))
    PriceFactory(
        gpu_model="H100-80GB",
        profile="full",
        hourly_price=Decimal("4200"),
        valid_from=datetime(2020, 1, 1, tzinfo=UTC),
    )
    objects = {"pool-requests": [], "pools": [], "invoices": []}
    for project in (tenancy.vision, tenancy.recsys):
        objects["pool-requests"] += [
            PoolRequestFactory(project=project, submitted_by=tenancy.acme_member).pk,
            PoolRequestFactory(project=project, state=RequestState.QUEUED).pk,
        ]
        objects["pools"].append(PoolFactory(project=project, cluster=cluster).pk)
    for tenant in (tenancy.acme, tenancy.globex):
        objects["invoices"] += [
            InvoiceFactory(tenant=tenant, month=date(2026, 1, 1)).pk,
            InvoiceFactory(tenant=tenant, month=date(2026, 2, 1), state="issued").pk,
        ]
    objects["projects"] = [tenancy.vision.pk, tenancy.recsys.pk]
    objects["tenants"] = [tenancy.acme.pk, tenancy.globex.pk]
    objects["capacity/nodes"] = list(NodeCapacity.objects.values_list("pk", flat=True))
    objects["capacity/gpus"] = list(GpuCapacity.objects.values_list("pk", flat=True)[:4])
    people = {
        "tenant admin": tenancy.acme_admin,
        "tenant member": tenancy.acme_member,
        "tenant viewer": tenancy.acme_viewer,
        "approver": staff_user("approver"),
        "finance": staff_user("finance"),
        "operator": staff_user("operator"),
    }
    return World(people=people, objects=objects, cluster=cluster)


@dataclass
class World:
    people: dict
    objects: dict[str, list[int]]
    cluster: Cluster

    def aim(self, case) -> None:
        """Point a generated `{id}` at a seeded object (the caller's tenant's, the other tenant's) or, one
        time in a few, at none; a generated value that is not a whole number is left as it is."""
        generated = (case.path_parameters or {}).get("id")
        collection = case.path.removeprefix("/api/v1/").split("/{")[0]
        if isinstance(generated, int) and generated >= 0 and collection in self.objects:
            ids = self.objects[collection]
            case.path_parameters["id"] = ids[generated % len(ids)] if generated % 5 else generated
        name = (case.path_parameters or {}).get("name")
        if isinstance(name, str) and len(name) % 2:  # a cluster's name: half the time the seeded one
            case.path_parameters["name"] = "sim"
        # A cluster or a purpose named in the query or the body is one GET /api/v1/clusters/ lists, when
        # it is well formed at all (an ill-formed one stays, to be refused).
        for values in (case.query, case.body):
            if not isinstance(values, dict):
                continue
            if well_formed(values.get("cluster")):
                values["cluster"] = self.cluster.name
            if well_formed(values.get("purpose")):
                values["purpose"] = sorted(GROUPS.values())[len(values["purpose"]) % len(GROUPS)]


def well_formed(name) -> bool:
    """Whether a generated value has the form of a cluster's or GPU group's name."""
    return isinstance(name, str) and re.fullmatch(DNS_LABEL_PATTERN, name) is not None


ROLES = ["tenant admin", "tenant member", "tenant viewer", "approver", "finance", "operator"]


@functools.cache
def portal() -> WSGIHandler:
    return WSGIHandler()


def application(environ, start_response):
    """The portal's WSGI app, made at the first request rather than at import: by then the test session
    has collected the static files that its middleware serves."""
    return portal()(environ, start_response)


def load(*, phase: str):
    loaded = schemathesis.openapi.from_dict(served_schema(), config=config(phase=phase))
    loaded.app = application
    return loaded


schema = load(phase="fuzzing")
boundaries = load(phase="coverage")
CAPACITY = "^/api/v1/capacity/"
NOT_CAPACITY = "^/api/v1/(?!capacity/)"


@pytest.fixture(autouse=True)
def _requests_keep_the_connection():
    """Django closes the database connection as each request ends, which its test client prevents:
    closing it would end the test's transaction, so the WSGI app is called as the test client calls it."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


HYPOTHESIS = settings(
    max_examples=EXAMPLES_PER_OPERATION,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def call_as(case, world, role: str) -> None:
    world.aim(case)
    key = tokens.issue_token(user=world.people[role]).key  # a fresh one: DELETE auth/token/ revokes it
    case.call_and_validate(headers={"Authorization": f"Token {key}"})


@pytest.mark.parametrize("role", ROLES)
@schema.parametrize()
@HYPOTHESIS
def test_api_as_each_role(case, role, world):
    call_as(case, world, role)


# The boundary values of every parameter and field, once: what they get does not depend on the role
# past the permission check, so each operation is sent them by a role that passes it.
@boundaries.exclude(path_regex=CAPACITY).parametrize()
@HYPOTHESIS
def test_api_boundaries_as_a_tenant_admin(case, world):
    call_as(case, world, "tenant admin")


@boundaries.exclude(path_regex=NOT_CAPACITY).parametrize()
@HYPOTHESIS
def test_capacity_api_boundaries_as_an_operator(case, world):
    call_as(case, world, "operator")


@schema.exclude(path_regex="^/api/v1/(?!monitoring/)").parametrize()
@HYPOTHESIS
def test_monitoring_api_as_a_node_agent(case, world):
    key = agents.issue_agent_token(cluster=world.cluster, name="h200-1").key
    case.call_and_validate(headers={"Authorization": f"Bearer {key}"})
