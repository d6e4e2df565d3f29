"""What a run of a check means: pass, fail or unknown, one line why, and the record of what ran.

Kept apart from the process handling (ranks.py) so that every outcome can be judged in a unit
test from plain data. The rules: a kernel that raised, died, or hung while it was being called
(phase "kernel") is a fail, and so is a number outside |err| <= atol + rtol*|ref| (NaN and inf
never pass: outputs are poisoned before each call). Everything that went wrong before the call
(no GPU of the arch, an import, the process group, a build that failed for another reason than
the arch) is `unknown`: the rung could not look, which is not a pass.

A check may also time the kernel against the path it replaces (`timing` in its result): the
record keeps it and a pass's reason says where the candidate is slower, but no timing turns a
verdict (run/timing.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sm120patch.probes.run import timing as run_timing
from sm120patch.probes.run.ranks import Child, Run, RunCheck
from sm120patch.probes.rungs import Step
from sm120patch.probes.spec import NO_ARCH

if TYPE_CHECKING:
    from sm120patch.arch import Arch

KERNEL_PHASE = "kernel"


def _gpu_list(devices: Iterable[dict[str, Any]], caps: bool = True) -> str:
    seen: dict[str, int] = {}
    for d in devices:
        cap = ".".join(str(c) for c in d.get("capability", []))
        label = f"{d.get('name', '?')} ({cap})" if caps else str(d.get("name", "?"))
        seen[label] = seen.get(label, 0) + 1
    return ", ".join(f"{n}x {label}" for label, n in seen.items()) or "none"


def _where(c: Child) -> str:
    case = c.info.get("case")
    return f"{c.phase} phase, case {case}" if case else f"{c.phase} phase"


def _detail(c: Child) -> str:
    """The error line, else the end of stderr."""
    if c.error and c.error.get("error"):
        return str(c.error["error"])[-400:]
    tail = c.stderr_tail.strip().splitlines()
    return " | ".join(tail[-3:])[-400:] if tail else "no output"


def judge_prepare(check: RunCheck, arch: Arch, prep: Run, budget: float) -> Step | None:
    """A Step when the prepare step ends the run (no GPUs of the arch, a failed build); else None."""
    c = prep.children[0]
    record: dict[str, Any] = {
        "check": check.name,
        "arch": arch.name,
        "prepare": c.to_dict(),
        "elapsed_s": prep.elapsed_s,
    }
    if prep.timed_out:
        why = f"run: {check.name}: preparing did not finish within {budget:.0f} s ({_where(c)})"
        return Step("unknown", why, {"run": record})
    if c.failed:
        detail = _detail(c)
        if c.phase == "build" and NO_ARCH in detail:
            return Step("fail", f"run: building for {arch.name}: {detail}", {"run": record})
        why = f"run: {check.name}: could not prepare ({_where(c)}, {c.how}): {detail}"
        return Step("unknown", why, {"run": record})
    result = c.result or {}
    devices = result.get("devices") or []
    record["visible"] = devices
    matching = result.get("matching") or []
    if len(matching) < check.world_size:
        seen = f"visible: {_gpu_list(devices)}" if devices else "torch sees no CUDA GPU"
        why = (
            f"run: {check.name} needs {check.world_size} GPU(s) of {arch.name} "
            f"(compute capability {arch.major}.{arch.minor}); {seen}"
        )
        return Step("unknown", why, {"run": record})
    return None


def _cases(run: Run) -> list[dict[str, Any]]:
    out = []
    for rank, c in enumerate(run.children):
        for case in (c.result or {}).get("cases") or []:
            out.append({**case, "rank": rank})
    return out


def _shapes(cases: list[dict[str, Any]]) -> str:
    seen: list[str] = []
    for c in cases:
        shape = "x".join(str(s) for s in c.get("shape") or [])
        if shape and shape not in seen:
            seen.append(shape)
    return ", ".join(seen)


def _unique(cases: list[dict[str, Any]], key: str) -> list[str]:
    out: list[str] = []
    for c in cases:
        v = c.get(key)
        if v is not None and str(v) not in out:
            out.append(str(v))
    return out


def _tolerance(cases: list[dict[str, Any]]) -> str:
    """The bound the cases were held to: one, or one per dtype."""
    by_dtype = {str(c.get("dtype")): f"{c.get('atol')}+{c.get('rtol')}|ref|" for c in cases}
    if len(set(by_dtype.values())) == 1:
        return f"|err| <= {next(iter(by_dtype.values()))}"
    return "|err| <= " + ", ".join(f"{t} ({d})" for d, t in by_dtype.items())


def _num(x: Any) -> str:
    return "n/a" if x is None else f"{float(x):.4g}"


def _setting(check: RunCheck, arch: Arch, run: Run, gpus: list[dict[str, Any]]) -> tuple[str, str]:
    results = [c.result or {} for c in run.children]
    api = next((r["api"] for r in results if r.get("api")), check.api)
    return api, f"on {_gpu_list(gpus, caps=False)} ({arch.name})"


def _failed_child(run: Run) -> Child | None:
    """The child that explains the run: the first to fail by itself, else one we killed in the kernel."""
    first = run.first_failure()
    if first is not None:
        return first
    stuck = [c for c in run.children if c.killed]
    return next((c for c in stuck if c.phase == KERNEL_PHASE), stuck[0] if stuck else None)


def judge_ranks(check: RunCheck, arch: Arch, prep: Run, run: Run) -> Step:
    """The verdict of the ranks' run, with evidence["run"] saying what ran and what it measured."""
    pres = prep.children[0].result or {}
    by_index = {d.get("index"): d for d in pres.get("devices") or []}
    gpus = [by_index.get(i, {"index": i}) for i in (pres.get("matching") or [])[: check.world_size]]
    api, where = _setting(check, arch, run, gpus)
    cases = _cases(run)
    record: dict[str, Any] = {
        "check": check.name,
        "api": api,
        "arch": arch.name,
        "gpus": gpus,
        "visible": pres.get("devices") or [],
        "world_size": check.world_size,
        "build_s": pres.get("build_s"),
        "run_s": run.elapsed_s,
        "elapsed_s": round(prep.elapsed_s + run.elapsed_s, 3),
        "shapes": _shapes(cases),
        "dtypes": _unique(cases, "dtype"),
        "modes": _unique(cases, "mode"),
        "cases": cases,
        "timing": run_timing.timing_of(run),
        "ranks": [c.to_dict() for c in run.children],
    }
    evidence = {"run": record}
    bad = _failed_child(run)
    if bad is not None:
        detail, at = _detail(bad), _where(bad)
        if run.timed_out and not run.first_failure():
            stuck = [c for c in run.children if c.killed]
            hung = any(c.phase == KERNEL_PHASE for c in stuck)
            where_each = "; ".join(f"{c.name} in the {_where(c)}" for c in stuck)
            why = f"run: {api} {where}: no answer within {run.elapsed_s:.0f} s, killed {where_each}"
            return Step("fail" if hung else "unknown", why, evidence)
        if bad.phase == KERNEL_PHASE:
            return Step("fail", f"run: {api} {where}: {bad.name} {bad.how} ({at}): {detail}", evidence)
        return Step("unknown", f"run: {api} {where}: {bad.name} {bad.how} ({at}): {detail}", evidence)
    names = [{c.get("name") for c in (ch.result or {}).get("cases") or []} for ch in run.children]
    if not cases or any(not n for n in names) or any(n != names[0] for n in names):
        why = f"run: {check.name}: the ranks reported no cases, or different ones ({[sorted(n) for n in names]})"
        return Step("unknown", why, evidence)
    what = f"{', '.join(record['dtypes'])} [{record['shapes']}]" + (
        f" {'+'.join(record['modes'])}" if record["modes"] else ""
    )
    worst = max((c["max_abs_err"] for c in cases if c.get("max_abs_err") is not None), default=None)
    failing = [c for c in cases if not c.get("ok")]
    if failing:
        shown = []
        for c in failing[:4]:
            nonfinite = f", {c.get('n_nonfinite')} not finite" if c.get("n_nonfinite") else ""
            shown.append(
                f"{c.get('name')} rank {c['rank']}: {c.get('n_bad')} of {c.get('numel')} elements off{nonfinite}, "
                f"max abs error {_num(c.get('max_abs_err'))}" + (f" ({c['error']})" if c.get("error") else "")
            )
        more = f"; and {len(failing) - 4} more" if len(failing) > 4 else ""
        why = (
            f"run: {api} {where}, {what}: wrong numbers in {len(failing)} of {len(cases)} checks "
            f"({_tolerance(cases)} against a float32 reference): {'; '.join(shown)}{more}"
        )
        return Step("fail", why, evidence)
    why = (
        f"run: {api} {where}, {what}: max abs error {_num(worst)} within {_tolerance(cases)} "
        f"against a float32 reference ({len(cases)} checks, {len(run.children)} rank(s), {record['elapsed_s']:.0f} s)"
    )
    timed = run_timing.summary(record["timing"])
    return Step("pass", f"{why}; {timed}" if timed else why, evidence)
