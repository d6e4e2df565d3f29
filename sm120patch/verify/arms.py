"""Which recipes are measured together: the arms of a comparison, from the dependency graph.

A recipe runs with what it stands on. sglang-allreduce-fusion-sm120 on SGLang 0.5.9 opens a gate
whose kernels exist only with flashinfer-trtllm-comm-sm120 (the FlashInfer backport) in the same
tree; measured alone, the backport changes nothing at run time, and the gate without it cannot
even be applied (its probe blocks it). So:

- a candidate that stands on other candidates is measured with them (one arm: the gate and the
  backport under it);
- a candidate that others stand on is no arm of its own: it is kept when an arm holding it is
  kept, rolled back when none is;
- a recipe applied now that stands on a candidate joins the candidates (rolling the candidate
  back for the baseline takes its dependents with it, so they are judged with it);
- a candidate standing on a recipe that is not a candidate stays on it: that recipe is in
  every arm, the baseline too.

"Stands on" is the engine's rule, read here, never restated: the dependents the FlashInfer
journal recorded at apply, or an SGLang entry whose proof read files a FlashInfer recipe changed
(engine/pipeline.py `_dependents_of`, which `rollback` uses). Without `--one-at-a-time` every
candidate is in one arm ("all"), as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field


@dataclass
class Arms:
    arms: dict[str, list[str]]  # arm name -> recipe ids applied in it beyond the baseline
    candidates: list[str]  # the candidates, with the dependents that joined
    why: dict[str, str] = field(default_factory=dict)  # arm or recipe -> why it is judged as it is

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def build(
    candidates: Sequence[str],
    stands_on: Mapping[str, set[str]],
    applied: set[str],
    one_at_a_time: bool,
) -> Arms:
    """The arms for these candidates; `stands_on`: recipe id -> ids it stands on (applied ones)."""
    cands = list(dict.fromkeys(candidates))
    why: dict[str, str] = {}
    grew = True
    while grew:  # a dependent of a candidate is a candidate (and so on, though one level is the rule today)
        grew = False
        for dep in sorted(stands_on):
            sup = sorted(stands_on[dep] & set(cands))
            if dep in applied and dep not in cands and sup:
                cands.append(dep)
                why[dep] = f"joined the candidates: it stands on {', '.join(sup)}, which is one"
                grew = True
    if not one_at_a_time:
        if len(cands) == 1:
            return Arms({cands[0]: list(cands)}, cands, why)
        return Arms({"all": list(cands)}, cands, why)
    under = {s for c in cands for s in stands_on.get(c, set()) if s in cands}
    arms: dict[str, list[str]] = {}
    for c in cands:
        if c in under:
            deps = sorted(d for d in cands if c in stands_on.get(d, set()))
            why[c] = (
                f"no arm of its own: its effect is through {', '.join(deps)}, which stand(s) on it; "
                "kept when one of them is kept"
            )
            continue
        sup = sorted(stands_on.get(c, set()) & set(cands))
        arms[c] = [c, *sup]
        if sup:
            said = f"measured with {', '.join(sup)}: it stands on it"
            why[c] = f"{why[c]}; {said}" if c in why else said
    return Arms(arms, cands, why)
