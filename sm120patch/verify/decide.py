"""Keep a candidate only when it is not slower beyond the measured noise and its answers agree.

The rule, per candidate (a recipe, or all candidates together):

1. it launched and became ready every time (a crash or a hang is a rollback, with the diagnosis);
2. no more failed requests than the baseline had;
3. at every concurrency, its mean output tok/s over its runs is not below the baseline's by more
   than the noise (schedule.noise: twice the standard error of the difference, at least the floor);
4. enough valid answers: at every concurrency, in every run, at least MIN_VALID of its requests
   answered validly, and at least one answer to compare with the baseline's;
5. answers agree (answers.py): no collapse the baseline does not show, no known answer lost, and
   an agreement rate of at least AGREE_MIN, or the baseline's own agreement with itself across its
   launches where that is lower (then the server is not deterministic even without the recipe).

Where the measurement cannot tell (issue 31.5): a candidate that is not slower beyond the noise,
but whose noise is wider than the smallest effect the user cares about (`--min-effect`, default
5 %) while the low end of its interval (change - noise) lies below -min-effect, may be slower by
more than the user accepts: the verdict is "inconclusive", with the repeats (noise shrinks as the
square root of the runs) or the requests a load that would bring the noise under min-effect, and
the user's policy decides (`--if-inconclusive keep|rollback`, default keep).

Answers are compared between the first run of each arm at each concurrency: the same prompts
at the same concurrency, so batching is alike; by tokens where both runs carry them (`--logprobs`),
by characters otherwise, and the summary line says which.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sm120patch.verify import answers, schedule
from sm120patch.verify.workload import Prompt

MIN_EFFECT = 0.05  # the smallest slowdown a user cares about, unless told (--min-effect)
NOT_EXERCISED = "not exercised by this workload"
# verdicts that keep the recipe and count as a pass for the exit status
PASSING = ("kept", NOT_EXERCISED)
MIN_VALID = 0.5  # a load where fewer than half the requests gave a valid answer compares nothing
# one run of one arm: {concurrency: {"summary": metrics.summarize(...), "outputs": {prompt id: text}}}
Run = Mapping[int, Mapping[str, Any]]


@dataclass
class Decision:
    name: str
    recipes: list[str]
    keep: bool
    reasons: list[str]  # why not kept (empty when kept)
    summary: str  # one line, what `status` shows
    throughput: dict[int, dict[str, Any]] = field(default_factory=dict)
    answers: dict[str, Any] = field(default_factory=dict)
    launch: dict[str, Any] | None = None  # the failed launch, when there was one
    verdict: str = ""  # "kept" | "rolled back" | "left as it was" (not judged) | "inconclusive, kept/rolled back"
    # | NOT_EXERCISED (no recipe of the arm logged its taken line: kept, not measured)
    taken: list[str] = field(default_factory=list)  # recipes of the arm whose taken line the server logged
    not_exercised: list[str] = field(default_factory=list)  # recipes with a taken line that never appeared

    def __post_init__(self) -> None:
        self.verdict = self.verdict or ("kept" if self.keep else "rolled back")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "throughput": {str(c): v for c, v in self.throughput.items()}}  # JSON keys


def _answers(prompts: Sequence[Prompt], base: Sequence[Run], cand: Sequence[Run]) -> dict[str, Any]:
    agg: dict[str, Any] = {"compared": 0, "agree": 0, "exact": 0, "known": 0, "correct_base": 0, "correct_cand": 0}
    agg.update(by_tokens=0, collapses=[], divergences=[])
    self_cmp = {"compared": 0, "agree": 0}
    for c in sorted(cand[0]):
        b, x = base[0][c], cand[0][c]
        one = answers.compare_sets(prompts, b["outputs"], x["outputs"], b.get("tokens"), x.get("tokens"))
        for k in ("compared", "agree", "exact", "known", "correct_base", "correct_cand", "by_tokens"):
            agg[k] += one[k]
        agg["collapses"] += [{**x, "concurrency": c} for x in one["collapses"]]
        agg["divergences"] += [{**x, "concurrency": c} for x in one["divergences"]]
        if len(base) > 1 and c in base[1]:
            b2 = base[1][c]
            again = answers.compare_sets(prompts, b["outputs"], b2["outputs"], b.get("tokens"), b2.get("tokens"))
            self_cmp["compared"] += again["compared"]
            self_cmp["agree"] += again["agree"]
    agg["by"] = _by(agg["by_tokens"], agg["compared"])
    agg["baseline_self"] = self_cmp if self_cmp["compared"] else None
    rate = self_cmp["agree"] / self_cmp["compared"] if self_cmp["compared"] else 1.0
    agg["required_rate"] = min(answers.AGREE_MIN, rate)
    return agg


def _by(tokens: int, compared: int) -> str:
    """How the answers were compared, in the words a report line uses."""
    if compared and tokens == compared:
        return "by tokens"
    if tokens:
        return f"by tokens for {tokens} of {compared}, characters for the rest"
    return "by characters"


def _pct(x: float) -> str:
    return f"{x * 100:+.0f}%"


def decide(
    name: str,
    recipes: Sequence[str],
    prompts: Sequence[Prompt],
    base: Sequence[Run],
    cand: Sequence[Run],
    launch_failure: dict[str, Any] | None = None,
    noise_floor: float = schedule.NOISE_FLOOR,
    min_effect: float = MIN_EFFECT,
    if_inconclusive: str = "keep",
) -> Decision:
    """Apply the rule above to one candidate's runs and the baseline's."""
    if launch_failure is not None:
        outcome, cause = launch_failure.get("outcome", "failed"), launch_failure.get("cause", "see the log")
        if outcome == "not built":  # recipes applied when verify started stay as they were, unjudged
            why = f"not judged: {cause}"
            return Decision(name, list(recipes), True, [why], why, launch=launch_failure, verdict="left as it was")
        why = f"not applied: {cause}" if outcome == "not applied" else f"server {outcome} with it: {cause}"
        return Decision(name, list(recipes), False, [why], why, launch=launch_failure)
    if not cand or not base:
        return Decision(name, list(recipes), False, ["no runs to compare"], "no runs to compare")
    reasons: list[str] = []
    thr: dict[int, dict[str, Any]] = {}
    for c in sorted(cand[0]):
        b = [r[c]["summary"]["output_throughput"] for r in base if c in r]
        k = [r[c]["summary"]["output_throughput"] for r in cand if c in r]
        thr[c] = schedule.compare(b, k, floor=noise_floor)
        failed_b = max((r[c]["summary"]["failed"] for r in base if c in r), default=0)
        failed_c = max(r[c]["summary"]["failed"] for r in cand if c in r)
        if failed_c > failed_b:
            reasons.append(f"{failed_c} requests failed at c={c} (baseline: {failed_b})")
        for r in cand:
            s = r[c]["summary"] if c in r else None
            n = s["completed"] + s["failed"] if s else 0
            if s and n and s["completed"] < MIN_VALID * n:
                first = f" (first error: {s['errors'][0]})" if s["errors"] else ""
                reasons.append(f"not enough valid answers: {s['completed']} of {n} at c={c}{first}")
                break
        if thr[c]["worse"]:
            reasons.append(f"slower: {_pct(thr[c]['delta'])} output tok/s at c={c} (noise +-{thr[c]['noise']:.0%})")
    ans = _answers(prompts, base, cand)
    if not ans["compared"]:
        reasons.append("no answers to compare: no prompt was answered validly by both arms")
    if ans["collapses"]:
        first = ans["collapses"][0]
        reasons.append(f"{len(ans['collapses'])} collapsed output(s), e.g. {first['prompt']}: {first['why']}")
    if ans["correct_cand"] < ans["correct_base"]:
        reasons.append(f"known answers {ans['correct_cand']}/{ans['known']} (baseline {ans['correct_base']})")
    if ans["compared"] and ans["agree"] / ans["compared"] < ans["required_rate"]:
        reasons.append(f"answers agree {ans['agree']}/{ans['compared']}, below {ans['required_rate']:.0%}")
    speed = ", ".join(f"{_pct(v['delta'])} output tok/s at c={c}" for c, v in thr.items() if v["delta"] is not None)
    noise = max((v["noise"] for v in thr.values() if v["noise"] is not None), default=0.0)
    agree = f"answers agree {ans['agree']}/{ans['compared']} {ans['by']}"
    figures = f"{speed} (noise +-{noise:.0%}), {len(cand)} repeat(s); {agree}"
    keep = not reasons
    summary = figures if keep else "; ".join(reasons)
    unsure = _inconclusive(thr, cand, min_effect, noise_floor) if keep else None
    if unsure:
        keep = if_inconclusive == "keep"
        verdict = "inconclusive, kept" if keep else "inconclusive, rolled back"
        policy = f"{'kept' if keep else 'rolled back'} (--if-inconclusive {if_inconclusive})"
        summary = f"{unsure}; {figures}; {policy}"
        return Decision(name, list(recipes), keep, [] if keep else [unsure], summary, thr, ans, verdict=verdict)
    return Decision(name, list(recipes), keep, reasons, summary, thr, ans)


def _inconclusive(
    thr: Mapping[int, Mapping[str, Any]], cand: Sequence[Run], min_effect: float, floor: float
) -> str | None:
    """Why the speed figures cannot tell a slowdown of min_effect from none, and what would."""
    for c, v in thr.items():
        if v["delta"] is None or v["noise"] <= min_effect or v["delta"] - v["noise"] >= -min_effect:
            continue
        noise = v["noise"]
        head = f"inconclusive: noise +-{noise:.0%} at c={c}, wider than --min-effect {min_effect:.0%}"
        if noise <= floor:  # the floor alone: more runs cannot narrow it
            return f"{head} (it is --noise-floor {floor:.0%}; lower it or raise --min-effect)"
        k = (noise / min_effect) ** 2  # the noise shrinks as 1/sqrt(runs)
        runs = len(cand)
        s = [r[c]["summary"] for r in cand if c in r]
        per_load = max((x.get("completed", 0) + x.get("failed", 0) for x in s), default=0)
        more = f"about {math.ceil(runs * k)} repeats"
        if per_load:
            more += f" (or about {math.ceil(per_load * k)} --requests a load, where the scatter is within a load)"
        return f"{head}; {more} would resolve it"
    return None


def exercised(d: Decision, wired: set[str], taken: set[str]) -> Decision:
    """Mark what the server's log said: the arm's recipes whose taken line appeared (`taken`), and
    those whose patched code carries the line (`wired`) but never logged it. When every recipe of
    an arm that launched and was measured is of the second kind, the workload never reached its
    gate: its figures are noise about the same code, so the verdict is NOT_EXERCISED, kept as it
    is (a crash or a refused arm keeps its own verdict: that launch ran code of the recipe or not)."""
    d.taken = [r for r in d.recipes if r in taken]
    d.not_exercised = [r for r in d.recipes if r in wired and r not in taken]
    if d.launch is not None or d.verdict == "left as it was" or not d.recipes:
        return d
    if d.summary == "no runs to compare" or set(d.not_exercised) != set(d.recipes):
        return d
    measured = d.summary
    ids = ", ".join(d.recipes)
    summary = (
        f"{NOT_EXERCISED}: the server never logged `sm120patch: <id> taken` for {ids}, so the workload never "
        f"reached the gate; kept as it is, its figures not judged ({measured})"
    )
    return Decision(
        d.name,
        list(d.recipes),
        True,
        [],
        summary,
        d.throughput,
        d.answers,
        verdict=NOT_EXERCISED,
        taken=[],
        not_exercised=list(d.not_exercised),
    )
