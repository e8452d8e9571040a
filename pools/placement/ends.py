"""When work ends, for placement: how near a GPU's work ends to a new pool's end.

A GPU can be re-cut, or given whole, only once all its work has ended. A new pool put beside work that ends
about when it does leaves that GPU wholly free at about the time it would have been anyway; beside work that
ends much sooner, it keeps the GPU from coming free; beside work that ends much later, it leaves an instance
free on a GPU that stays in use. So among GPUs otherwise equal, placement prefers those whose work ends
nearest the pool's end.

Words used here:
- end: a plain whole number in the caller's clock (pools/placement/types.py), or None: no end known, which
  counts as far away, later than any known end.
- a GPU's end: when the last of its work ends (None when some of it has no end), pools/placement/plan.py.
- gap: how far apart two ends are, as a sort key; two ends far away are no gap at all, a known end and one
  far away are further apart than any two known ends.

Pure: plain data in and out.
"""

from __future__ import annotations

__all__ = ["NO_GAP", "gap"]

Gap = tuple[int, int]
NO_GAP: Gap = (0, 0)


def gap(ends: int | None, other: int | None) -> Gap:
    """How far apart two ends are, ordered: (0, distance) for two known ends; two far away ones are (0, 0);
    a known one and one far away are (1, -the known one), further than any two known, and less far the
    later the known one is."""
    if ends is None:
        return NO_GAP if other is None else (1, -other)
    if other is None:
        return (1, -ends)
    return (0, abs(ends - other))
