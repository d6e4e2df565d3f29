"""The status vocabulary: every status a recipe can have in a plan, a run or a bundle, with the
policy beside it (whether it makes a command exit 1, the colour it is printed in, what to do
about it), so that no command keeps a set of its own and no module spells a status by hand.

`Status` is an Enum whose members are also `str` (its value, the word users see): JSON, f-strings,
`==` against a string read back from a manifest or a cache, and dict lookups all give exactly the
bytes they gave when statuses were plain constants, while a name outside the vocabulary is an error
where it is made (`Status.of`), not a word that a later reader refuses (the untested manifest,
issue 21). Python 3.10 has no `StrEnum`; `__str__`/`__format__` are str's so `f"{s:<14}"` is the
word on every version. The module-level names (APPLICABLE, ...) are the members themselves, kept
for the code and tests that import them from here or from `planning.plan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Status(str, Enum):
    APPLICABLE = "applicable"  # the gate is there and shuts the arch out; `apply` would open it
    SATISFIED = "satisfied"  # the release already admits the arch
    NOT_APPLICABLE = "not-applicable"  # version out of range, other GPUs, or no such gate
    BLOCKED = "blocked"  # the probe did not prove the kernels the recipe needs
    APPLIED = "applied"  # written and journaled after its probe passed
    REVERTED = "reverted"  # was applied; `apply` took it back because it had gone stale
    STALE = "stale"  # applied, but the kernels its probe proved are gone from the FlashInfer now in front of it
    FAILED = "failed"  # an edit could not be made safely (rewritten code did not compile, ...)
    UNTESTED = "untested"  # the gate is there, but the release is newer than any the recipe was tested on
    EXCLUDED = "excluded"  # left out by --exclude: not probed, not written

    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def of(cls, value: object) -> Status:
        """The member for a status word; ValueError for anything outside the vocabulary."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a recipe status; use one of {', '.join(s.value for s in cls)}"
            ) from None


@dataclass(frozen=True)
class Policy:
    fails: bool  # a command whose plan, run or bundle holds it exits 1 (README, "Exit codes")
    colour: str  # click colour name for the status column
    advice: str  # what to do, for `preflight`; {root} and {id} are the tree and the recipe, shell-quoted


POLICY: dict[Status, Policy] = {
    Status.APPLICABLE: Policy(False, "yellow", "run `sm120patch apply {root}`"),
    Status.SATISFIED: Policy(False, "green", "nothing to do: this release already opens the gate"),
    Status.NOT_APPLICABLE: Policy(False, "bright_black", "nothing to do"),
    Status.BLOCKED: Policy(True, "red", "upgrade FlashInfer (see the probe reason), or leave this gate shut"),
    Status.APPLIED: Policy(False, "cyan", "applied; `sm120patch rollback {root} --recipe {id}` takes it back"),
    Status.REVERTED: Policy(
        True, "magenta", "it went stale and was taken back: upgrade FlashInfer (see the reason), then apply again"
    ),
    Status.STALE: Policy(
        True,
        "red",
        "the kernels it needs are gone: run `sm120patch rollback {root} --recipe {id}` before the next start",
    ),
    Status.FAILED: Policy(
        True, "red", "an edit could not be made safely (see the reason): leave this gate shut and report it"
    ),
    Status.UNTESTED: Policy(
        True,
        "yellow",
        "this release is newer than any the recipe was tested on: review the diff (`sm120patch plan`), "
        "then `sm120patch apply {root} --allow-untested` if it is right",
    ),
    Status.EXCLUDED: Policy(False, "bright_black", "left out by --exclude: drop the flag to plan it"),
}

APPLICABLE = Status.APPLICABLE
SATISFIED = Status.SATISFIED
NOT_APPLICABLE = Status.NOT_APPLICABLE
BLOCKED = Status.BLOCKED
APPLIED = Status.APPLIED
REVERTED = Status.REVERTED
STALE = Status.STALE
FAILED = Status.FAILED
UNTESTED = Status.UNTESTED
EXCLUDED = Status.EXCLUDED

# A bundle's manifest (bundle/format.py) says `exported` for a recipe whose patch is in the series
# (the plan said applicable); every other recipe keeps its plan status. Export and the reader both
# check against this set, so nothing export writes can be refused when it is read back.
EXPORTED = "exported"
IN_BUNDLE = frozenset({EXPORTED, *(s.value for s in Status if s is not APPLICABLE)})

# A command whose plan or run holds one of these exits 1; `--ok-blocked` takes BLOCKED out, for an
# image build that expects some recipes to stay blocked.
FAILING = frozenset(s for s, p in POLICY.items() if p.fails)


def fails(status: str, ok_blocked: bool = False) -> bool:
    """Whether a recipe in this status (a plan's, or a bundle manifest's) makes the command exit 1."""
    return status in FAILING and not (ok_blocked and status == BLOCKED)


def colour(status: str) -> str | None:
    """The colour a status is printed in (None for a word outside the vocabulary: uncoloured)."""
    policy = POLICY.get(status)  # type: ignore[call-overload]
    return policy.colour if policy else None


def advice(status: str, root: str, recipe_id: str) -> str:
    """What to do about a recipe in this status; root and recipe_id as they go into a shell."""
    policy = POLICY.get(status)  # type: ignore[call-overload]
    return policy.advice.format(root=root, id=recipe_id) if policy else ""


def bundle_status(status: str) -> str:
    """A manifest status, checked: ValueError for a word the bundle reader would refuse."""
    if status not in IN_BUNDLE:
        raise ValueError(f"{status!r} is not a bundle status; use one of {', '.join(sorted(IN_BUNDLE))}")
    return status
