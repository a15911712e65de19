"""Links that transfers share: weights to the clusters, KV to relays and back, snapshots to host.

A link serves its transfers in the order they start, each at the link's full bandwidth (a FIFO
queue). For transfers that start together this ends the batch exactly when fair sharing would,
the last one at sum(bytes) / bandwidth, while earlier ones finish sooner than under fair sharing;
it keeps every completion time known when the transfer starts, which the event loop needs.

A transfer across several links (`transfer`) holds all of them at once and moves at the slowest
leg's rate; a leg may be several links in parallel (the relays of a fan-in), whose rates add.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cadencerl.hardware.catalog import GB, Link


@dataclass
class LinkQueue:
    name: str
    bandwidth: float          # bytes per second
    latency: float
    report: str = ""          # the link's entry in the run's bytes-per-link figure
    free_at: float = 0.0      # when the transfers already queued have all left
    bytes_moved: float = 0.0

    def finish(self, start: float, nbytes: float) -> float:
        """When a transfer of `nbytes` starting at `start` would arrive (nothing is reserved)."""
        return max(start, self.free_at) + nbytes / self.bandwidth + self.latency

    def send(self, start: float, nbytes: float, count: bool = True) -> float:
        """Queue a transfer; return its arrival time. `count=False` for a hop whose bytes another
        link of the same path already reports."""
        begin = max(start, self.free_at)
        self.free_at = begin + nbytes / self.bandwidth
        self.bytes_moved += nbytes if count else 0.0
        return self.free_at + self.latency


def _plan(start: float, nbytes: float, legs: list[list[LinkQueue]]) -> tuple[float, float, float]:
    begin = max([start] + [q.free_at for leg in legs for q in leg])
    rate = min(sum(q.bandwidth for q in leg) for leg in legs)
    latency = max(q.latency for leg in legs for q in leg)
    return begin, begin + nbytes / rate, latency


def transfer_finish(start: float, nbytes: float, *legs: list[LinkQueue]) -> float:
    """When a transfer over `legs` would arrive (nothing is reserved)."""
    _begin, end, latency = _plan(start, nbytes, list(legs))
    return end + latency


def transfer(start: float, nbytes: float, *legs: list[LinkQueue], counted: int = 0) -> float:
    """Queue a transfer that holds every link of every leg; its bytes count on leg `counted`."""
    _begin, end, latency = _plan(start, nbytes, list(legs))
    for i, leg in enumerate(legs):
        for q in leg:
            q.free_at = end
            if i == counted:
                q.bytes_moved += nbytes / len(leg)
    return end + latency


@dataclass
class Links:
    """Every shared link of a run by name, so the result can report bytes moved per link."""

    queues: dict[str, LinkQueue] = field(default_factory=dict)

    def get(self, name: str, link: Link, lanes: int = 1, report: str | None = None) -> LinkQueue:
        """The queue called `name`, created on first use over `lanes` parallel NICs of `link`;
        its bytes count under `report` (default: the name)."""
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = LinkQueue(name, link.bandwidth_gbs * GB * lanes, link.latency_s,
                                              report or name)
        return q

    def bytes_by_link(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for q in self.queues.values():
            if q.bytes_moved:
                out[q.report] = out.get(q.report, 0.0) + q.bytes_moved
        return dict(sorted(out.items()))
