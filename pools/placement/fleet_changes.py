"""Changes to a fleet for a what-if run ("had we had 8 more H200s", "without node h100-3"): read from the
command line's words and applied to the placement engine's Fleet, in the order given.

Words used here:
- add: N whole GPUs of one model (pools/gpu_models.py), MIG off and free, schedulable, in new nodes of at most
  8 GPUs named `added-1`, `added-2`, … (the next free numbers), optionally in a GPU group. Written
  "N MODEL [GROUP]".
- remove: every GPU of one node. Written "NODE".
- regroup: every GPU of one node moves to a group (nothing after "=": out of any group). Written
  "NODE=GROUP".
- node name: as placement sees it, "CLUSTER/NODE"; the node's own name alone will do where only one
  cluster has a node of that name.
- peak: the most GPUs a fleet holds while its changes apply in turn, reckoned from a count of GPUs per node
  (NodeSize) without building any GPU: what a cap on a what-if run's fleet is checked against.

Pure: plain data in, plain data out; bad input raises FleetChangeError, which says what was expected.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace

from pools.gpu_models import is_model_name
from pools.mig import GPU_MODELS
from pools.placement.types import Fleet, Gpu

__all__ = [
    "ADD",
    "MAX_ADDED_GPUS",
    "NODE_SIZE",
    "REGROUP",
    "REMOVE",
    "AddGpus",
    "FleetChange",
    "FleetChangeError",
    "NodeSize",
    "Regroup",
    "RemoveNode",
    "apply_changes",
    "node_sizes",
    "parse_change",
    "parse_changes",
    "peak_size",
]

ADD, REMOVE, REGROUP = "add", "remove", "regroup"
NODE_SIZE = 8  # GPUs per added node, as in the common 8-GPU server
# Far above any fleet the portal runs, low enough that a typo ("80000") is refused instead of making a run
# that never ends.
MAX_ADDED_GPUS = 10_000
# As a GpuGroup is named (a DNS label of at most 40 characters), so that an added or regrouped node's group
# is one the portal could hold.
_GROUP = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")
_GROUP_RULE = "lower-case letters, digits and '-', at most 40 characters, e.g. training"


class FleetChangeError(ValueError):
    """A fleet change that cannot be read or applied; the message says which and why."""


@dataclass(frozen=True)
class AddGpus:
    count: int
    model: str
    group: str | None = None


@dataclass(frozen=True)
class RemoveNode:
    node: str


@dataclass(frozen=True)
class Regroup:
    node: str
    group: str | None  # None: out of any group


FleetChange = AddGpus | RemoveNode | Regroup


@dataclass(frozen=True)
class NodeSize:
    """A node as the size of a changed fleet needs it: its name as placement has it, its cluster, its GPUs."""

    node: str
    cluster: str | None
    gpus: int


def parse_changes(changes: Iterable[tuple[str, str]]) -> tuple[FleetChange, ...]:
    """Each (kind, text) pair read, kinds ADD, REMOVE and REGROUP, keeping their order."""
    return tuple(parse_change(kind, text) for kind, text in changes)


def parse_change(kind: str, text: str) -> FleetChange:
    if not isinstance(text, str):
        raise FleetChangeError(f"--{kind} takes text, not {type(text).__name__}.")
    if kind == ADD:
        return _parse_add(text)
    if kind == REMOVE:
        node = text.strip()
        if not node:
            raise FleetChangeError("--remove takes the name of a node, e.g. --remove h100-3; got nothing.")
        return RemoveNode(node)
    if kind == REGROUP:
        return _parse_regroup(text)
    raise FleetChangeError(f"Unknown fleet change {kind!r}; the changes are {ADD}, {REMOVE} and {REGROUP}.")


def _parse_add(text: str) -> AddGpus:
    words = text.split()
    if len(words) not in (2, 3):
        raise FleetChangeError(
            f'--add takes "N MODEL [GROUP]", e.g. "8 H200-141GB training", not {text.strip()!r}.'
        )
    count_text, model_text = words[0], words[1]
    if not re.fullmatch(r"[0-9]+", count_text, flags=re.ASCII) or int(count_text) == 0:
        raise FleetChangeError(
            f"--add {text.strip()!r}: the count must be a whole number above 0, not {count_text!r}."
        )
    count = int(count_text)
    if count > MAX_ADDED_GPUS:
        raise FleetChangeError(
            f"--add {text.strip()!r}: at most {MAX_ADDED_GPUS} GPUs can be added at once, not {count}."
        )
    model = model_text.upper()
    if not is_model_name(model):
        known = ", ".join(GPU_MODELS)
        raise FleetChangeError(
            f"--add {text.strip()!r}: unknown GPU model {model_text!r}; known models: {known}, and any other "
            "GPU named by its family and the memory sold, such as L40S-48GB (given out whole)."
        )
    group = _group(words[2], f"--add {text.strip()!r}") if len(words) == 3 else None
    return AddGpus(count, model, group)


def _parse_regroup(text: str) -> Regroup:
    node, equals, group = text.strip().partition("=")
    node, group = node.strip(), group.strip()
    if not equals or not node:
        raise FleetChangeError(
            f'--regroup takes "NODE=GROUP", e.g. "h100-1=inference" ("h100-1=": out of any group), '
            f"not {text.strip()!r}."
        )
    return Regroup(node, _group(group, f"--regroup {text.strip()!r}") if group else None)


def _group(text: str, where: str) -> str:
    if not _GROUP.fullmatch(text):
        raise FleetChangeError(f"{where}: {text!r} is not a GPU group name ({_GROUP_RULE}).")
    return text


def apply_changes(
    fleet: Fleet, changes: Sequence[FleetChange], *, cluster: str | None = None
) -> tuple[Fleet, tuple[str, ...]]:
    """The fleet with each change applied in turn, and one line per change saying what it did. Added GPUs
    go to `cluster`, or to the fleet's only cluster when it is None. Raises FleetChangeError naming the
    change that cannot be applied (an unknown or ambiguous node, GPUs added to no clear cluster)."""
    gpus = list(fleet.gpus)
    said = []
    for change in changes:
        if isinstance(change, AddGpus):
            gpus, line = _add(gpus, change, cluster)
        elif isinstance(change, RemoveNode):
            node = _node(_node_names(gpus), change.node, f"--remove {change.node}")
            gone = [gpu for gpu in gpus if gpu.node == node]
            gpus = [gpu for gpu in gpus if gpu.node != node]
            line = f"removed {node}: {_models(gone)}"
        else:
            node = _node(_node_names(gpus), change.node, _regroup_words(change))
            before = sorted({gpu.group or "no group" for gpu in gpus if gpu.node == node})
            gpus = [replace(gpu, group=change.group) if gpu.node == node else gpu for gpu in gpus]
            line = f"regrouped {node} ({_count(gpus, node)} GPUs): {', '.join(before)} → "
            line += change.group or "no group"
        said.append(line)
    return Fleet(tuple(gpus)), tuple(said)


def node_sizes(fleet: Fleet) -> tuple[NodeSize, ...]:
    """The fleet's nodes, in the order their first GPU comes, each with its count of GPUs."""
    counts = Counter(gpu.node for gpu in fleet.gpus)
    clusters = {gpu.node: gpu.cluster for gpu in fleet.gpus}
    return tuple(NodeSize(node, clusters[node], count) for node, count in counts.items())


def peak_size(
    nodes: Iterable[NodeSize],
    changes: Sequence[FleetChange],
    *,
    cluster: str | None = None,
    limit: int | None = None,
) -> int:
    """The most GPUs the fleet of `nodes` holds while `changes` apply in turn (its size as it is, where there
    is no change), each change checked as apply_changes checks it (an unknown or ambiguous node, GPUs added
    to no clear cluster) with nothing built but a count per node. Once the fleet passes `limit` it stops and
    answers the size that passed it, so that checking a cap costs no more than the cap allows."""
    sizes = {size.node: size for size in nodes}
    total = peak = sum(size.gpus for size in sizes.values())
    for change in changes:
        if isinstance(change, AddGpus):
            where = _add_words(change)
            target = _target_cluster([size.cluster for size in sizes.values()], where, cluster)
            total += change.count
            if limit is not None and total > limit:
                return total
            for node, count in _new_nodes(sizes.keys(), target, change.count):
                sizes[node] = NodeSize(node, target, count)
        elif isinstance(change, RemoveNode):
            node = _node(list(sizes), change.node, f"--remove {change.node}")
            total -= sizes.pop(node).gpus
        else:
            _node(list(sizes), change.node, _regroup_words(change))
        peak = max(peak, total)
    return peak


def _add_words(change: AddGpus) -> str:
    return f"--add {change.count} {change.model}" + (f" {change.group}" if change.group else "")


def _regroup_words(change: Regroup) -> str:
    return f"--regroup {change.node}={change.group or ''}"


def _target_cluster(clusters: Iterable[str | None], where: str, cluster: str | None) -> str | None:
    """The cluster added GPUs go to: `cluster`, or the fleet's only one (`clusters`: its GPUs' or nodes')."""
    if cluster is not None:
        return cluster
    found = sorted(set(clusters))
    if len(found) != 1:
        held = f"spans the clusters {', '.join(found)}" if found else "has no GPU"
        raise FleetChangeError(f"{where}: the fleet {held}; name the cluster the GPUs go to.")
    return found[0]


def _new_nodes(taken: Collection[str], cluster: str | None, count: int) -> list[tuple[str, int]]:
    """The new nodes that `count` added GPUs fill, NODE_SIZE to a node, each with its number of GPUs: named
    `added-N` in `cluster`, N the next numbers no node of `taken` has."""
    nodes, number, left = [], 0, count
    while left:
        number += 1
        node = f"{cluster}/added-{number}" if cluster else f"added-{number}"
        if node in taken:
            continue
        nodes.append((node, min(left, NODE_SIZE)))
        left -= min(left, NODE_SIZE)
    return nodes


def _add(gpus: list[Gpu], change: AddGpus, cluster: str | None) -> tuple[list[Gpu], str]:
    where = _add_words(change)
    cluster = _target_cluster((gpu.cluster for gpu in gpus), where, cluster)
    taken = {gpu.node for gpu in gpus}
    ids = {gpu.id for gpu in gpus}
    added, names = [], []
    for node, size in _new_nodes(taken, cluster, change.count):
        for index in range(size):
            gpu_id = f"{node}/{index}"
            if gpu_id in ids:  # a fleet whose ids look like ours: never two GPUs of one id
                raise FleetChangeError(f"{where}: GPU id {gpu_id!r} is already in the fleet.")
            added.append(Gpu(gpu_id, node, change.model, mig=False, group=change.group, cluster=cluster))
        names.append(node)
    known = {gpu.group for gpu in gpus if gpu.cluster == cluster}
    group = f"in group {change.group}" if change.group else "in no group"
    if change.group and change.group not in known:
        group += " (a group no GPU of the cluster was in)"
    line = f"added {change.count} × {change.model} (MIG off) {group}: {', '.join(names)}"
    return gpus + added, line


def _node_names(gpus: Iterable[Gpu]) -> list[str]:
    return list(dict.fromkeys(gpu.node for gpu in gpus))


def _node(nodes: Sequence[str], name: str, where: str) -> str:
    """The node of that name among `nodes` (CLUSTER/NODE, or NODE alone where it is one cluster's only)."""
    if name in nodes:
        return name
    same = [node for node in nodes if node.rpartition("/")[2] == name]
    if len(same) == 1:
        return same[0]
    if same:
        raise FleetChangeError(
            f"{where}: several clusters have a node {name!r} ({', '.join(same)}); name it as CLUSTER/NODE."
        )
    short = {node.rpartition("/")[2]: node for node in nodes}
    close = difflib.get_close_matches(name, [*nodes, *short], n=5, cutoff=0.5)
    close = sorted({short.get(found, found) for found in close})
    if close:
        hint = f"close names: {', '.join(close)}"
    elif nodes:
        hint = f"no name is close; its nodes: {', '.join(nodes[:10])}" + (", …" if len(nodes) > 10 else "")
    else:
        hint = "it has no node"
    raise FleetChangeError(f"{where}: the fleet has no node {name!r}; {hint}.")


def _models(gpus: Iterable[Gpu]) -> str:
    counts = Counter(gpu.model for gpu in gpus)
    return ", ".join(f"{n} × {model}" for model, n in sorted(counts.items()))


def _count(gpus: Iterable[Gpu], node: str) -> int:
    return sum(1 for gpu in gpus if gpu.node == node)
