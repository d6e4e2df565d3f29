"""The status vocabulary: every status a recipe can have in a plan, a run or a bundle, with the
policy beside it (which statuses make a command exit 1, the colour each is printed in), so that
no command keeps a set of its own."""

from __future__ import annotations

APPLICABLE = "applicable"
SATISFIED = "satisfied"
NOT_APPLICABLE = "not-applicable"
BLOCKED = "blocked"
APPLIED = "applied"
REVERTED = "reverted"
STALE = "stale"  # applied, but the kernels its probe proved are gone from the FlashInfer now in front of it
FAILED = "failed"  # an edit could not be made safely (rewritten code did not compile, ...)
UNTESTED = "untested"  # the gate is there, but the release is newer than any the recipe was tested on
EXCLUDED = "excluded"  # left out by --exclude: not probed, not written

ALL = (APPLICABLE, SATISFIED, NOT_APPLICABLE, BLOCKED, APPLIED, REVERTED, STALE, FAILED, UNTESTED, EXCLUDED)

# A command whose plan or run holds one of these exits 1 (README, "Exit codes"); `--ok-blocked`
# takes BLOCKED out, for an image build that expects some recipes to stay blocked.
FAILING = frozenset({BLOCKED, FAILED, REVERTED, STALE, UNTESTED})

COLOUR = {
    APPLICABLE: "yellow",
    SATISFIED: "green",
    NOT_APPLICABLE: "bright_black",
    BLOCKED: "red",
    APPLIED: "cyan",
    REVERTED: "magenta",
    FAILED: "red",
    STALE: "red",
    UNTESTED: "yellow",
    EXCLUDED: "bright_black",
}


def fails(status: str, ok_blocked: bool = False) -> bool:
    """Whether a recipe in this status makes the command exit 1."""
    return status in FAILING and not (ok_blocked and status == BLOCKED)
