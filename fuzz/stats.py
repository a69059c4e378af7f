"""Small mergeable statistics: a log-bucket histogram of durations and exact percentiles."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Four buckets per doubling: percentiles are within about 19% of the true value, and the
# histogram of millions of mask timings stays a few dozen integers, cheap to send between processes.
_PER_OCTAVE = 4


@dataclass
class LogHistogram:
    """Durations in seconds, bucketed on a log scale; ``merge`` adds another histogram."""

    counts: dict[int, int] = field(default_factory=dict)
    n: int = 0
    total: float = 0.0
    max: float = 0.0

    def add(self, seconds: float) -> None:
        b = math.floor(math.log2(max(seconds, 1e-9)) * _PER_OCTAVE)
        self.counts[b] = self.counts.get(b, 0) + 1
        self.n += 1
        self.total += seconds
        self.max = max(self.max, seconds)

    def merge(self, other: LogHistogram) -> None:
        for b, c in other.counts.items():
            self.counts[b] = self.counts.get(b, 0) + c
        self.n += other.n
        self.total += other.total
        self.max = max(self.max, other.max)

    def percentile(self, q: float) -> float:
        """The upper edge of the bucket holding the ``q`` quantile (0 <= q <= 1); 0 if empty."""
        if not self.n:
            return 0.0
        rank, seen = q * self.n, 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                return min(2 ** ((b + 1) / _PER_OCTAVE), self.max)
        return self.max

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (0 when empty)."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]
