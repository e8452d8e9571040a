"""The NVIDIA device plugin's sharing configs as the portal writes them, for both drivers (facts in the GPU
reference, "Sharing without MIG").

Words used here:
- share mode: a node's sharing, written as a share profile (`ts-4`, `mps-2`), or "" for none;
- config: a key of the device plugin's ConfigMap whose value is a plugin config file; a node follows the
  one its label `nvidia.com/device-plugin.config` names, and reads it again only when that label changes.
  So the portal's keys are fixed per share mode (`portal-ts-4`, `portal-none`): a key never changes what
  it means, and a node changes mode by being labelled with another key.
"""

from __future__ import annotations

import yaml
from django.utils.translation import gettext as _

from pools import kinds
from pools.drivers.base import DriverError

CONFIG_LABEL = "nvidia.com/device-plugin.config"
STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
GPU_RESOURCE = "nvidia.com/gpu"
CONFIG_PREFIX = "portal-"
NO_SHARING = "none"


def check_profile(profile: str) -> None:
    """Refuse, with a DriverError saying what may be asked, a profile that is neither "" nor a share."""
    if not profile:
        return
    try:
        replicas = kinds.share_kind(profile).replicas(profile)
    except ValueError:
        replicas = None
    if replicas not in kinds.SHARE_COUNTS:
        raise DriverError(
            _(
                "%(profile)s is no share mode: ask for ts-N (time-sliced) or mps-N (MPS), N from %(low)s to "
                "%(high)s, or for none."
            )
            % {"profile": repr(profile), "low": kinds.SHARE_COUNTS.start, "high": kinds.SHARE_COUNTS.stop - 1}
        )


def config_key(profile: str) -> str:
    """The key of the portal's config for a share mode: `portal-ts-4`, `portal-none`."""
    return CONFIG_PREFIX + (profile or NO_SHARING)


def config_text(profile: str) -> str:
    """The plugin config file (YAML, config API v1) for a share mode: each MIG-off GPU advertised
    `replicas` times as nvidia.com/gpu.shared, one replica per container; nothing shared for none."""
    document: dict = {"version": "v1"}
    if profile:
        kind = kinds.share_kind(profile)
        document["sharing"] = {
            kind.config_key: {
                "renameByDefault": True,
                "failRequestsGreaterThanOne": True,
                "resources": [{"name": GPU_RESOURCE, "replicas": kind.replicas(profile)}],
            }
        }
    return yaml.safe_dump(document, sort_keys=False)


def profile_of_labels(labels: dict[str, str]) -> str:
    """The share mode feature discovery's labels show; ValueError naming what the portal cannot give out."""
    strategy = labels.get(STRATEGY_LABEL, "")
    replicas = labels.get(REPLICAS_LABEL, "1") or "1"
    try:
        count = int(replicas)
    except ValueError:
        raise ValueError(f"{REPLICAS_LABEL} is {replicas!r}, not a number") from None
    return kinds.share_profile(strategy, count)


def no_such_node(node: str) -> DriverError:
    return DriverError(
        _("Node %(node)s is not in the cluster: sync the cluster to see the nodes it has.") % {"node": node}
    )


def mig_change_pending(node: str) -> DriverError:
    return DriverError(
        _(
            "Node %(node)s has a MIG change under way: change its sharing once the GPU Operator has applied "
            "it."
        )
        % {"node": node}
    )
