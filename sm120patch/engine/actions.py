"""What one apply does, as data: a closed list of actions, each with its reason and its files.

`plan` computes the list from what is on disk (the journal, pip's versions and bytes, git) and
what is wanted (recipes, archs, probe level, --exclude) and prints it; `apply` reports the list
of what it did, in the same words, so the two can be held against each other (a test does, on
every release in the matrix). Modelled on a package manager's resolve-then-install and
Terraform's plan: the decision is a value before it is an effect.

The kinds, in the order apply carries them out (FlashInfer's before SGLang's within a step):

- retire: a journal entry pip made obsolete (`pipstate`) is dropped; the journal only, no byte;
- rollback-dependent: an SGLang recipe proven on a FlashInfer recipe that is gone is taken back;
- rollback-stale: an applied recipe whose proof no longer holds is taken back;
- record-proof: an applied recipe's proof renewed on a changed FlashInfer, or a written recipe's
  proof (and, for SGLang, the FlashInfer recipes it stands on) kept in the journal;
- write: a proven recipe's bytes written through the journal;
- commit: with --commit on a git tree, one commit per written recipe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class ActionKind(str, Enum):
    """The closed set of things an apply may do to a tree or its journal."""

    RETIRE = "retire"
    ROLLBACK_DEPENDENT = "rollback-dependent"
    ROLLBACK_STALE = "rollback-stale"
    RECORD_PROOF = "record-proof"
    WRITE = "write"
    COMMIT = "commit"

    __str__ = str.__str__  # the word, on every Python (as Status)
    __format__ = str.__format__


@dataclass(frozen=True)
class Action:
    """One step of an apply: what, where (the tree's root and the package), which recipe, why,
    and the files (relative to the tree's root) it changes or whose record it changes."""

    kind: ActionKind
    tree: str
    package: str
    recipe: str
    reason: str
    files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ActionKind(self.kind))  # a kind outside the set is refused here
        object.__setattr__(self, "files", tuple(sorted(self.files)))

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "tree": self.tree,
            "package": self.package,
            "recipe": self.recipe,
            "reason": self.reason,
            "files": list(self.files),
        }

    def line(self, width: int = 0) -> str:
        """One line a user reads: the kind, the recipe, and why."""
        unsaid = [f for f in self.files if f not in self.reason]
        where = f" ({', '.join(self.files)})" if unsaid else ""
        return f"{self.kind.value:<18} {self.recipe:<{width}}  {self.reason}{where}"


def render(actions: Sequence[Action]) -> list[str]:
    """The plan's action section: what an apply with the same inputs would do, in order."""
    if not actions:
        return ["actions: none (an apply with these inputs changes nothing)"]
    width = max(len(a.recipe) for a in actions)
    return [f"actions ({len(actions)}, in the order apply carries them out):", *(f"  {a.line(width)}" for a in actions)]
