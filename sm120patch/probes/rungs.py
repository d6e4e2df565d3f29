"""The probe ladder's vocabulary, in one place: the rungs in order, and what one rung answers.

Kept free of heavy imports: the CLI, the engine's journal records and the pre-flight
report all name rungs, and none of them should pay for importing the probes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# cheapest first; a verdict stands on the highest rung that gave a definitive answer
RUNGS = ("static", "artifact", "spec", "build", "run")
# what --probe accepts: a rung, or none (skip the check on purpose)
LEVELS = ("none", *RUNGS)
RESULTS = ("pass", "fail", "unknown")


def rung_index(name: str) -> int:
    """Position of a rung (or "none", -1) in the ladder; unknown names sort lowest."""
    return RUNGS.index(name) if name in RUNGS else -1


@dataclass
class Step:
    """What one rung answered.

    `result` is pass, fail, unknown (it looked and could not tell, or could not look) or
    skip (nothing for it to look at). A `final` fail ends the climb (no build can succeed
    once the generator refuses the arch); a non-final one is a finding the climb keeps,
    so a higher rung can add its own (a launch problem in host code and empty kernel
    bodies in the cubin). `evidence` records what the rung read: files with their sha256
    (relative to the FlashInfer package), so a later run can tell whether it still holds.
    """

    result: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    final: bool = True

    def to_dict(self, rung: str) -> dict[str, Any]:
        return {"rung": rung, "result": self.result, "reason": self.reason}
