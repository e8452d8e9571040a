"""A mixed fleet for bench/placement.py: MIG, whole GPUs and shares side by side, as a real fleet holds them.

Nodes of 8 GPUs in four GPU groups, each offering what such a group would (pools/kinds: offers):
- training: H100-80GB, whole GPUs and MIG; half the GPUs in use, whole or cut;
- serving: H200-141GB, MIG only; cut, about half the instances in use;
- shared: L40S-48GB (no MIG), whole GPUs and time-sliced quarters; some nodes already in quarters;
- notebooks: A100-80GB, MIG and MPS halves; some nodes already in halves.
Requests name a group and ask for what it offers: whole GPUs, MIG instances of the common sizes, or shares.

Everything is a function of the seed: the same seed gives the same fleet and queue.
"""

from __future__ import annotations

import random
from collections import Counter

from pools import mig
from pools.placement import Fleet, Gpu, Item, Request, Slot
from pools.placement.plan import share_slots

GPUS_PER_NODE = 8
# group -> (model, offers, share of the nodes)
GROUPS: dict[str, tuple[str, tuple[str, ...], int]] = {
    "training": ("H100-80GB", ("whole", "mig"), 35),
    "serving": ("H200-141GB", ("mig",), 25),
    "shared": ("L40S-48GB", ("whole", "ts-4"), 20),
    "notebooks": ("A100-80GB", ("mig", "mps-2"), 20),
}
# What a group's requests ask for: (profile, weight); counts as for MIG requests.
ASKED: dict[str, tuple[tuple[str, int], ...]] = {
    "training": (("full", 40), ("3g.40gb", 20), ("1g.10gb", 20), ("2g.20gb", 20)),
    "serving": (("1g.18gb", 40), ("2g.35gb", 25), ("3g.71gb", 25), ("7g.141gb", 10)),
    "shared": (("ts-4", 70), ("full", 30)),
    "notebooks": (("mps-2", 60), ("1g.10gb", 25), ("3g.40gb", 15)),
}
COUNTS = (1, 1, 1, 2, 2, 3, 4)
IN_USE = 0.5


def mixed_fleet(seed: int, nodes: int) -> Fleet:
    rnd = random.Random(seed)
    names, weights = list(GROUPS), [GROUPS[name][2] for name in GROUPS]
    gpus: list[Gpu] = []
    for n in range(nodes):
        group = rnd.choices(names, weights)[0]
        model, offers, _share = GROUPS[group]
        node = f"{group}-{n}"
        shares = [offer for offer in offers if offer not in ("whole", "mig")]
        sharing = shares[0] if shares and rnd.random() < 0.5 else ""
        for index in range(GPUS_PER_NODE):
            gpus.append(_gpu(rnd, f"{node}/{index}", node, model, offers, group, sharing))
    return Fleet(tuple(gpus))


def _gpu(rnd: random.Random, gpu_id: str, node: str, model: str, offers, group: str, sharing: str) -> Gpu:
    common = dict(id=gpu_id, node=node, model=model, group=group, offers=offers, sharing=sharing)
    if sharing:
        shares = tuple(Slot(p, s, rnd.random() < IN_USE) for p, s in share_slots(sharing))
        return Gpu(mig=False, instances=shares, **common)
    if "mig" in offers and (rnd.random() < 0.7 or "whole" not in offers):
        geometry = mig.gpu_model(model)
        profiles = [p for p in geometry.profiles if not p.endswith("+me")]
        counts = Counter(rnd.choice(profiles) for _ in range(rnd.randint(1, 5)))
        layout = mig.place_profiles(geometry, counts) or []
        slots = tuple(Slot(i.profile, i.start, rnd.random() < IN_USE) for i in layout)
        return Gpu(mig=True, instances=slots, **common)
    return Gpu(mig=False, allocated=rnd.random() < IN_USE, **common)


def mixed_requests(seed: int, count: int) -> list[Request]:
    rnd = random.Random(seed + 1)
    requests = []
    for n in range(count):
        group = rnd.choices(list(GROUPS), [GROUPS[g][2] for g in GROUPS])[0]
        profiles, weights = zip(*ASKED[group], strict=True)
        profile = rnd.choices(profiles, weights)[0]
        requests.append(Request(f"m{n}", (Item(GROUPS[group][0], profile, rnd.choice(COUNTS)),), group))
    return requests


def check_modes(fleet: Fleet) -> list[str]:
    """What breaks the device plugin's rule in a fleet: every MIG-off GPU of a node in the node's mode."""
    modes: dict[str, set[str]] = {}
    for gpu in fleet.gpus:
        modes.setdefault(gpu.node, set()).add(gpu.sharing)
        if (
            not gpu.mig
            and gpu.sharing
            and [(s.profile, s.start) for s in gpu.instances] != list(share_slots(gpu.sharing))
        ):
            return [f"{gpu.id} in {gpu.sharing} holds {gpu.instances}"]
    return [f"node {node} is in modes {sorted(found)}" for node, found in modes.items() if len(found) > 1]
