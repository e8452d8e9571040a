"""How the GPU Operator's emulated operands (MIG manager, device plugin) react to a node's config label in
the test API server: late, on their own thread, only to the latest change, and as a test forces them to.

Words used here:
- operand: a per-node agent of the GPU Operator that follows a config label on its node;
- generation: the count of config-label changes an operand has seen on a node; a timer started for an older
  generation does nothing when it fires;
- outcome: what the next apply on a node does, forced by a test; `success` is what the operand would do.
"""

from __future__ import annotations

import threading
from copy import deepcopy
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from tests.kube.server import KubeApiServer


class Operand:
    """Timers per node and generation, stopped with the server, and outcomes a test forces per node."""

    outcomes: ClassVar[tuple[str, ...]] = ("success",)

    def __init__(self, server: KubeApiServer) -> None:
        self._server = server
        self._generations: dict[str, int] = {}
        self._outcomes: dict[str, tuple[str, int | None]] = {}
        self._timers: set[threading.Timer] = set()
        self._stopped = False

    def set_outcome(self, node: str, outcome: str, applies: int | None = 1) -> None:
        if outcome not in self.outcomes:
            raise ValueError(f"outcome must be one of {self.outcomes}, not {outcome!r}")
        if outcome == "success":
            self._outcomes.pop(node, None)
        else:
            self._outcomes[node] = (outcome, applies)

    def stop(self) -> None:
        with self._server.lock:
            self._stopped = True
            timers, self._timers = self._timers, set()
        for timer in timers:
            timer.cancel()

    def _take_outcome(self, node: str) -> str:
        outcome, applies = self._outcomes.get(node, ("success", None))
        if applies is not None:
            if applies <= 1:
                self._outcomes.pop(node, None)
            else:
                self._outcomes[node] = (outcome, applies - 1)
        return outcome

    def _next_generation(self, name: str) -> int:
        generation = self._generations.get(name, 0) + 1
        self._generations[name] = generation
        return generation

    def _schedule(self, delay: float, action: Any, name: str, generation: int) -> None:
        """Call `action(node, generation)` after `delay`, under the lock, with a copy of the stored node,
        unless the server stopped or the node changed generation or went away meanwhile."""
        if self._stopped:
            return
        timer = threading.Timer(delay, self._fire, args=(action, name, generation))
        timer.daemon = True
        self._timers.add(timer)
        timer.start()

    def _fire(self, action: Any, name: str, generation: int) -> None:
        with self._server.lock:
            self._timers = {timer for timer in self._timers if timer.is_alive()}
            if self._stopped or self._generations.get(name) != generation:
                return
            node = self._server.store.get("Node", name)
            if node is None:
                return
            action(deepcopy(node), generation)
