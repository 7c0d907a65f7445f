"""The CRS's running view of the online nodes' load, for the manager's node choices."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ha_placement.scores import GuestSize, NodeCapacity, basic_scores, static_scores
from ha_placement.select import Placed, used_nodes


class Usage:
    """The CRS view of the online nodes (PVE::HA::Usage::Basic / Static)."""

    def __init__(self, online: Sequence[str], static: bool, capacity: Mapping[str, NodeCapacity],
                 sizes: Mapping[str, GuestSize]) -> None:
        self.online = list(online)
        self.online_set = set(online)
        self.static = static
        self.capacity = capacity
        self.sizes = sizes
        self.users: dict[str, set[str]] = {n: set() for n in online}
        self.cpu: dict[str, float] = {n: 0.0 for n in online}
        self.mem: dict[str, float] = {n: 0.0 for n in online}
        self.where: dict[str, tuple[str, ...]] = {}
        #: Bumped on every change; scores are cached per resource and version.
        self.version = 0
        self.cache: dict[str, tuple[int, dict[str, float]]] = {}

    def add(self, sid: str, placed: Placed) -> None:
        nodes = tuple(n for n in used_nodes(self.online_set, placed) if n is not None)
        self.add_on(sid, nodes)

    def add_on(self, sid: str, nodes: tuple[str, ...]) -> None:
        self.version += 1
        self.where[sid] = nodes
        size = self.sizes.get(sid)
        for node in nodes:
            self.users[node].add(sid)
            if self.static and size is not None:
                cap = self.capacity[node]
                self.cpu[node] += cap.maxcpu if size.maxcpu == 0 else size.maxcpu
                self.mem[node] += size.maxmem

    def remove(self, sid: str) -> None:
        self.version += 1
        size = self.sizes.get(sid)
        for node in self.where.pop(sid, ()):
            self.users[node].discard(sid)
            if self.static and size is not None:
                cap = self.capacity[node]
                self.cpu[node] -= cap.maxcpu if size.maxcpu == 0 else size.maxcpu
                self.mem[node] -= size.maxmem

    def score(self, sid: str) -> dict[str, float]:
        cached = self.cache.get(sid)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        result = self._score(sid)
        self.cache[sid] = (self.version, result)
        return result

    def _score(self, sid: str) -> dict[str, float]:
        if not self.static:
            return basic_scores({n: len(u) for n, u in self.users.items()})
        size = self.sizes.get(sid)
        if size is None:
            # Upstream: scoring fails without the guest's stats, every node scores 0.
            return {n: 0.0 for n in self.online}
        return static_scores(self.online, self.capacity, self.cpu, self.mem, size)
