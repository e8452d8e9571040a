"""The simulated cluster's watch log: how its state (pools/drivers/simulated.py) is listed and watched as a
Kubernetes cluster is (pools/drivers/base.py).

Words used here:
- seen: per stream (nodes, pods, claims), a digest of each object as the state was last logged; a pod's
  digest covers the devices of its claims, a claim's the node of its device, so that they change with them;
- log: under the state's key `watch`, the version, and one entry (version, stream, list key) for each
  object that changed at that version, the LOG_LIMIT newest kept; `since` is the oldest version a watch may
  start from (older ones are Expired, as on a real cluster once its history is compacted);
- epoch: a log started afresh (a state seeded again, or saved over by someone holding an older copy) has a
  new one, and versions name theirs (`<epoch>-<number>`): a version of another epoch is Expired.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable, Iterator, Mapping

from pools.drivers.base import CLAIMS, NODES, PODS, Expired, Item, Page, Versions, list_key

PAGE = 500
LOG_LIMIT = 5000


def _digest(value: object) -> str:
    return hashlib.blake2b(json.dumps(value, sort_keys=True).encode(), digest_size=8).hexdigest()


def pod_key(pod: Mapping) -> str:
    return list_key(pod["namespace"], pod["name"])


def holds_gpu(pod: Mapping) -> bool:
    return bool(pod.get("claims")) or any(name.startswith("nvidia.com/") for name in pod["resources"])


def paged(items: list[Item], key: Callable[[Item], str], versions: Versions) -> Iterator[Page[Item]]:
    """A whole list as a real server pages it: PAGE objects at a time, in list-key order."""
    ordered = sorted(items, key=key)
    after = None
    for start in range(0, max(len(ordered), 1), PAGE):
        chunk = ordered[start : start + PAGE]
        upto = key(chunk[-1]) if start + PAGE < len(ordered) else None
        yield Page(tuple(chunk), after, upto, versions)
        after = upto


def log_changes(state: dict, device_nodes: Mapping[str, str]) -> bool:
    """Log under a new version each node, pod and claim that changed since the state was last logged
    (`device_nodes`: each device's node, by UUID); whether any did."""
    log = state.setdefault(
        "watch", {"epoch": secrets.token_hex(4), "version": 0, "since": 0, "entries": [], "seen": {}}
    )
    claims = {
        list_key(c["namespace"], c["name"]): _digest([c, device_nodes.get(c["uuid"], "")])
        for c in state.get("claims", [])
    }
    now = {
        NODES: {name: _digest(node) for name, node in state["nodes"].items()},
        PODS: {
            pod_key(p): _digest([p, [claims.get(list_key(p["namespace"], c)) for c in p.get("claims", ())]])
            for p in state["pods"]
        },
        CLAIMS: claims,
    }
    seen = log["seen"]
    changed = [
        (stream, key)
        for stream, digests in now.items()
        for key in sorted(set(digests) | set(seen.get(stream, {})))
        if digests.get(key) != seen.get(stream, {}).get(key)
    ]
    if not changed:
        return False
    log["version"] += 1
    log["entries"].extend([log["version"], stream, key] for stream, key in changed)
    if len(log["entries"]) > LOG_LIMIT:
        dropped = log["entries"][: len(log["entries"]) - LOG_LIMIT]
        log["entries"] = log["entries"][len(dropped) :]
        log["since"] = max(log["since"], dropped[-1][0])
    log["seen"] = now
    return True


def version_of(log: dict) -> str:
    return f"{log['epoch']}-{log['version']}"


def logged(log: dict, since: Versions) -> tuple[dict[str, list[str]], str]:
    """The keys each stream's log holds after its version (in the order they changed), and the log's
    version; Expired for a version the log no longer reaches, or of another epoch."""
    changed: dict[str, list[str]] = {NODES: [], PODS: [], CLAIMS: []}
    after = {}
    for stream, version in since.items():
        epoch, _dash, number = version.rpartition("-")
        if epoch != log["epoch"] or not number.isdigit():
            raise Expired(stream, f"{version} is no version of this log")
        after[stream] = int(number)
        if after[stream] < log["since"]:
            raise Expired(stream, f"the log starts after version {version}")
    for version, stream, key in log["entries"]:
        if stream in after and version > after[stream] and key not in changed[stream]:
            changed[stream].append(key)
    return changed, version_of(log)


def compact(log: dict) -> None:
    """Forget the log: a watch from any version before now is Expired."""
    log["entries"] = []
    log["since"] = log["version"]
