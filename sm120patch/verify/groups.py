"""Find the arms that break the rule by splitting the set (adaptive group testing), not one by one.

verify judges every arm together first (A B A). Only when that combination breaks the rule
(slower beyond the noise, answers that disagree or collapse, a crash) does it look for the
culprits: the set is halved; a half that breaks the rule is halved again; a half that passes is
cleared, and then the other half must hold a culprit (the whole set broke the rule), so it is
split without a measurement of its own. With one culprit among N arms that is about log2(N)
measurements instead of N; each is a launch with the arms and a baseline launch after it.

The assumption is that arms act alone (no two arms that only break the rule together); the
kept set is measured together once more at the end (the confirmation), which is where an
interaction would show. The functions here are pure: `test(arms)` is whatever measures.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field


@dataclass
class Search:
    culprits: list[str] = field(default_factory=list)  # arms found to break the rule
    inferred: dict[str, list[str]] = field(default_factory=dict)  # culprit -> the cleared half that implied it
    tests: list[list[str]] = field(default_factory=list)  # every set measured, in order


def search(arms: Sequence[str], test: Callable[[list[str]], bool]) -> Search:
    """The culprits among `arms`, known (measured) to break the rule together; `test(subset)` is
    True when that subset breaks the rule."""
    out = Search()

    def measured(group: list[str]) -> bool:
        out.tests.append(list(group))
        return test(list(group))

    def split(group: list[str], cleared: list[str] | None = None) -> None:
        if len(group) == 1:
            out.culprits.append(group[0])
            if cleared is not None:
                out.inferred[group[0]] = cleared
            return
        half = len(group) // 2
        left, right = group[:half], group[half:]
        if measured(left):
            split(left)
            if measured(right):
                split(right)
        else:
            split(right, left)

    split(list(arms))
    return out


def launches(n_arms: int, bad: set[int], repeats: int = 1, crashing: Collection[int] = ()) -> int:
    """Launches verify makes for `n_arms` arms of which those in `bad` break the rule: the first
    baseline, then for every measurement `repeats` x (arms, baseline); together first, the search
    when it fails, and the confirmation of the kept set when some are left and the search did not
    measure exactly that set already (what runner.Runner._together_then_split does). A set that
    holds an arm in `crashing` (a subset of `bad`: its server dies at start) costs one launch: no
    baseline brackets a server that never served, and its repeats are not run."""
    arms = [str(i) for i in range(n_arms)]
    culprits = {str(i) for i in bad}
    crash = {str(i) for i in crashing}
    sets = [arms]  # together
    if culprits:
        found = search(arms, lambda s: bool(culprits & set(s)))
        sets += found.tests
        rest = [a for a in arms if a not in found.culprits]
        cleared = [t for t in found.tests if not culprits & set(t)]
        if rest and rest not in cleared:
            sets.append(rest)  # the confirmation (a kept set measured as it is already is its own)
    return 1 + sum(1 if crash & set(s) else 2 * repeats for s in sets)


def one_at_a_time_launches(n_arms: int, repeats: int = 1) -> int:
    """`--one-at-a-time`: A B1 A B2 A ..., `repeats` rounds."""
    return 1 + 2 * n_arms * repeats
