"""When work ends, for placement: how well a new pool's end fits beside the work a GPU holds.

A GPU can be re-cut, or given whole, only once all its work has ended: it is busy from its first tenant's
arrival to its last tenant's end. A new pool put beside work that ends later than it does adds nothing to that
busy time; beside work that ends sooner, it keeps the GPU from coming free for the difference (its
extension), while the rest of the GPU cannot be re-cut nor given whole. So among GPUs otherwise equal,
placement prefers the one whose busy time the pool extends least; among those it does not extend, the one
whose work ends soonest after the pool's own, so that the instance left free when the pool ends stays free
for the shortest time, and GPUs whose work ends much later keep their free instances for longer work.

Words used here:
- end: a plain whole number in the caller's clock (pools/placement/types.py), or None: no end known, which
  counts as far away, later than any known end.
- a GPU's end: when the last of its work ends (None when some of it has no end), pools/placement/plan.py.
- fit: how a pool's end fits beside a GPU's end, as a sort key, best first: a pool with an end extends a
  GPU whose end is known and sooner by the difference, and extends none whose end is later or far away
  (those far away come after every known one); a pool with no end extends every GPU whose end is known
  without bound (the later that end, the better), and no GPU whose end is far away.

Pure: plain data in and out.
"""

from __future__ import annotations

__all__ = ["SAME_END", "fit"]

# (extends without bound, how much it extends, no end known on the GPU, how long after the pool's end)
Fit = tuple[int, int, int, int]
SAME_END: Fit = (0, 0, 0, 0)


def fit(ends: int | None, other: int | None) -> Fit:
    """How a pool ending at `ends` fits beside work ending at `other` (a GPU's end), lower is better: first by
    how much it extends the GPU's busy time, then by how long the GPU stays busy after the pool has ended.
    Two equal ends, and two far away, are SAME_END."""
    if ends is None:
        return SAME_END if other is None else (1, -other, 0, 0)
    if other is None:
        return (0, 0, 1, 0)
    if ends > other:
        return (0, ends - other, 0, 0)
    return (0, 0, 0, other - ends)
