"""Factories for tests: `ProjectFactory(tenant=acme)`, `MembershipFactory(role=Role.ADMIN)`,
`PoolFactory(project__tenant=acme, state=PoolState.RELEASED)`. One module per app's concern, every
factory importable from here.

They make rows a test needs as given state. A test about a transition goes through the services
(`submit_request`, `approve_request`, `admit_waiting`, …) instead, since only they write events.
"""

from tests.factories.billing import InvoiceFactory, PriceFactory, PriceListFactory
from tests.factories.capacity import (
    ClusterFactory,
    GpuCapacityFactory,
    GpuGroupFactory,
    NodeCapacityFactory,
    SpecAndCountFactory,
)
from tests.factories.monitoring import AlertFactory, AlertRuleFactory
from tests.factories.pools import (
    APPROVED_STATES,
    DEFAULT_ITEMS,
    ENDED_STATES,
    AllocationFactory,
    PoolFactory,
    PoolRequestFactory,
    RequestItemFactory,
)
from tests.factories.tenancy import (
    PASSWORD,
    InvitationFactory,
    MembershipFactory,
    ProjectFactory,
    TenantFactory,
    UserFactory,
    enable_totp,
    totp_code,
)
from tests.factories.whatif import WhatIfRunFactory, whatif_report

__all__ = [
    "APPROVED_STATES",
    "DEFAULT_ITEMS",
    "ENDED_STATES",
    "PASSWORD",
    "AlertFactory",
    "AlertRuleFactory",
    "AllocationFactory",
    "ClusterFactory",
    "GpuCapacityFactory",
    "GpuGroupFactory",
    "InvitationFactory",
    "InvoiceFactory",
    "MembershipFactory",
    "NodeCapacityFactory",
    "PoolFactory",
    "PoolRequestFactory",
    "PriceFactory",
    "PriceListFactory",
    "ProjectFactory",
    "RequestItemFactory",
    "SpecAndCountFactory",
    "TenantFactory",
    "UserFactory",
    "WhatIfRunFactory",
    "enable_totp",
    "totp_code",
    "whatif_report",
]
