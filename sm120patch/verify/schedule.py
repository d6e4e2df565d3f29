"""Which launch comes when, and how much the figures move between launches of the same tree.

Interleaving: the baseline first, then each candidate followed by the baseline again, the whole
round `repeats` times: A B A (one candidate, one repeat), A B1 A B2 A (two, one at a time),
A B A B A (one, two repeats). Every candidate run sits between two baseline runs, so a drift
(thermals, clocks, a neighbour on the box) moves both arms and shows up as the baseline's spread,
not as a verdict on the candidate.

Noise is measured, not assumed: for each arm, the half-range of its runs relative to their median
((max - min) / 2 / median); the noise of a comparison is the larger of the two arms' and
NOISE_FLOOR. A candidate is slower only when its median falls below the baseline's by more than
that.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BASELINE = "baseline"
NOISE_FLOOR = 0.02  # two runs of the same tree never differ by less than this on a real server


@dataclass(frozen=True)
class Step:
    arm: str  # BASELINE or a candidate's name
    round: int  # 0-based repeat this launch belongs to (the first baseline: round 0)


def interleave(candidates: Sequence[str], repeats: int) -> list[Step]:
    """A, then (B_i, A) for every candidate, `repeats` times."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    steps = [Step(BASELINE, 0)]
    for r in range(repeats):
        for c in candidates:
            steps += [Step(c, r), Step(BASELINE, r)]
    return steps


def spread(values: Sequence[float]) -> float:
    """Half-range over median: 0.05 means the runs lie within about +-5 % of their median."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return (max(values) - min(values)) / 2 / mid if mid else 0.0


def compare(base: Sequence[float], cand: Sequence[float], higher_is_better: bool = True) -> dict[str, Any]:
    """Candidate against baseline for one figure: relative change of the medians, the noise,
    and whether the candidate is worse by more than the noise."""
    if not base or not cand:
        return {"delta": None, "noise": None, "worse": None, "base": list(base), "cand": list(cand)}
    mb, mc = statistics.median(base), statistics.median(cand)
    delta = (mc / mb - 1.0) if mb else 0.0
    noise = max(spread(base), spread(cand), NOISE_FLOOR)
    worse = delta < -noise if higher_is_better else delta > noise
    return {"delta": delta, "noise": noise, "worse": worse, "base": list(base), "cand": list(cand)}
