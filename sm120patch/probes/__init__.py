"""The probe ladder: do the kernels a recipe needs exist for this arch, and how sure are we?

Rungs, cheapest first (their order lives in `rungs.RUNGS`): static (read the generator's
arch gate and the host-code facts in kernels.toml), artifact (read ELF/fatbin headers of
prebuilt kernels), spec (ask FlashInfer in a subprocess), build (nvcc for the arch, then
read the cubins back), run (the GPU). The ladder climbs up to the level asked, stops at
the first final fail, and every verdict says which rung it reached and which was asked:
a static pass is a weaker claim than a build, and only a run catches a kernel that
computes garbage. A rung that could not look says `unknown`; no evidence is not a pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120patch.arch import Arch
from sm120patch.catalogue.kernels import Kernel, get_kernel
from sm120patch.errors import UserError
from sm120patch.probes.environment.flashinfer import FlashInferEnv
from sm120patch.probes.rungs import RESULTS, RUNGS, Step, rung_index
from sm120patch.probes.verdict_cache import ProbeCache, default_cache_dir

# The rungs (artifact, build, evidence, run, spec, static) are imported where a probe climbs, not
# here: importing any `sm120patch.probes.*` module runs this file, and `plan --probe none` (the CLI's
# common options, the engine) only needs the light ones.

__all__ = [
    "RESULTS",
    "RUNGS",
    "ProbeCache",
    "Verdict",
    "prefetch_spec",
    "probe_kernel",
    "probe_recipe",
    "recipe_passes",
]


@dataclass
class Verdict:
    kernel: str
    arch: str
    result: str  # pass / fail / unknown
    rung: str  # the highest rung that gave a definitive answer ("none" if none did)
    reason: str  # why: every fail found, else the pass and what higher rungs could not see
    elapsed_s: float
    cached: bool = False
    asked: str = ""  # the rung the caller asked for
    steps: list[dict[str, Any]] = field(default_factory=list)  # what each rung said
    evidence: dict[str, Any] = field(default_factory=dict)  # FlashInfer and the files read

    @property
    def short_of_asked(self) -> bool:
        """The verdict stands on a lower rung than asked (a rung above could not look)."""
        return rung_index(self.rung) < rung_index(self.asked)

    def to_dict(self) -> dict[str, object]:
        return {
            "kernel": self.kernel,
            "arch": self.arch,
            "result": self.result,
            "rung": self.rung,
            "asked": self.asked,
            "reason": self.reason,
            "elapsed_s": self.elapsed_s,
            "cached": self.cached,
            "steps": self.steps,
            "evidence": self.evidence,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        keys = ("kernel", "arch", "result", "rung", "reason", "elapsed_s", "cached", "asked", "steps", "evidence")
        return cls(**{k: d[k] for k in keys if k in d})


def _artifact(kernel: Kernel, arch: Arch, fi: FlashInferEnv) -> Step:
    from sm120patch.probes.artifact import jit_module_files, scan_paths

    roots = [p for p in (fi.jit_cache_dir, *fi.user_cache_dirs) if p]
    scan = scan_paths(jit_module_files(roots, kernel.jit_modules))
    sm = arch.major * 10 + arch.minor
    if sm in scan.sms:
        return Step("pass", f"artifact: prebuilt {scan.files_for(sm)[0]} holds sm_{sm} SASS")
    if scan.files:
        return Step("skip", f"artifact: prebuilt modules hold SASS for {scan.sms}, not sm_{sm}")
    return Step("skip", "artifact: no prebuilt module (JIT cache, ~/.cache/flashinfer) to read")


def _absent(kernel: Kernel, arch: Arch, fi: FlashInferEnv, top: int) -> tuple[str, Step]:
    """A kernel family that does not exist for `arch`: fail, with artifact evidence if asked."""
    head = kernel.why.strip().splitlines()[0]
    reason = f"kernels.toml: {kernel.id} does not exist for {arch.name} ({head})"
    if top >= rung_index("artifact") and fi.cubin_dir and kernel.cubin_globs:
        from sm120patch.probes.artifact import scan_cubins

        scan = scan_cubins(fi.cubin_dir, kernel.cubin_globs)
        sm = arch.major * 10 + arch.minor
        if sm in scan.sms:
            return "artifact", Step(
                "unknown",
                f"artifact: kernels.toml says {kernel.id} is absent on {arch.name}, "
                f"but {scan.files_for(sm)[0]} holds sm_{sm}: update kernels.toml",
            )
        if scan.files:
            reason += f"; artifact: {len(scan.files)} cubins in {fi.cubin_dir} are for SM {scan.sms}, none for sm_{sm}"
            return "artifact", Step("fail", reason)
    return "static", Step("fail", reason)


def _cache_key(kernel: Kernel, arch: Arch, fi: FlashInferEnv, level: str) -> str:
    """Everything a verdict depends on that is cheap to read: the kernel's catalogue entry,
    the arch, the FlashInfer (version, where, which interpreter) and the bytes of the files
    the static rung reads. What higher rungs read (the headers a build compiled) is in the
    verdict's evidence and checked on every hit."""
    from sm120patch.probes.evidence import fingerprint
    from sm120patch.probes.run.rung import run_fingerprint

    return ProbeCache.key(
        {
            "kernel": repr(kernel),
            "arch": arch.name,
            "level": level,
            "version": fi.version,
            "location": fi.location,
            "files": fingerprint(fi, kernel),
            "python": fi.python,
            "sys_path": str(fi.sys_path),
            "source": fi.source,
            "cubin": str(fi.cubin_dir),
            "jit_cache": str(fi.jit_cache_dir),
            **({"run_check": run_fingerprint(kernel)} if level == "run" else {}),
        }
    )


def probe_kernel(
    kernel_id: str,
    arch: Arch,
    fi: FlashInferEnv,
    level: str = "spec",
    cache: ProbeCache | None = None,
    catalogue: dict[str, Kernel] | None = None,
) -> Verdict:
    """Climb the ladder for one kernel and arch, up to `level` (default: safe without a GPU)."""
    if level not in RUNGS:
        raise UserError(f"--probe {level!r}: unknown level; use one of {', '.join(RUNGS)}")
    from sm120patch.probes.evidence import changes

    start = time.monotonic()
    kernel = get_kernel(kernel_id, catalogue)
    if not fi.found:
        return Verdict(kernel_id, arch.name, "unknown", "none", fi.error or "FlashInfer not found", 0.0, asked=level)
    key = _cache_key(kernel, arch, fi, level) if cache else ""
    # a cached verdict counts only while every file it read (headers a build compiled, too) is unchanged
    if cache and (hit := cache.get(key)) and not changes(hit.get("evidence") or {}, fi):
        v = Verdict.from_dict(hit)
        v.cached, v.elapsed_s = True, round(time.monotonic() - start, 3)
        return v
    verdict = _climb(kernel, arch, fi, level, cache)
    verdict.elapsed_s = round(time.monotonic() - start, 3)
    if cache and verdict.result in ("pass", "fail"):
        cache.put(key, verdict.to_dict())
    return verdict


def _climb(kernel: Kernel, arch: Arch, fi: FlashInferEnv, level: str, cache: ProbeCache | None) -> Verdict:
    from sm120patch.probes.build import check_build
    from sm120patch.probes.evidence import fingerprint
    from sm120patch.probes.run.rung import check_run
    from sm120patch.probes.spec import check_spec
    from sm120patch.probes.static import check_static

    top = rung_index(level)
    where = {"version": fi.version, "location": fi.identity, "python": fi.python, "source": fi.source}
    evidence = {"flashinfer": where, "files": fingerprint(fi, kernel)}
    if kernel.absent_on(arch):
        rung, step = _absent(kernel, arch, fi, top)
        return Verdict(
            kernel.id, arch.name, step.result, rung, step.reason, 0.0, asked=level,
            steps=[step.to_dict(rung)], evidence=evidence,
        )  # fmt: skip
    cache_root = Path(cache.root if cache else default_cache_dir())
    rungs: dict[str, Callable[[], Step]] = {
        "static": lambda: check_static(kernel, arch, fi),
        "artifact": lambda: _artifact(kernel, arch, fi),
        "spec": lambda: check_spec(kernel, arch, fi, commands=top >= rung_index("build"), cache_root=cache_root),
        "build": lambda: check_build(kernel, arch, fi, cache_root),
        "run": lambda: check_run(kernel, arch, fi, cache_root),
    }
    steps: list[tuple[str, Step]] = []
    for name in RUNGS[: top + 1]:
        step = rungs[name]()
        steps.append((name, step))
        for k, v in step.evidence.items():
            if k == "files":
                evidence["files"] = {**evidence["files"], **v}
            else:
                evidence[k] = v
        if step.result == "fail" and step.final:
            break
    return _judge(kernel, arch, level, steps, evidence)


def _judge(kernel: Kernel, arch: Arch, level: str, steps: list[tuple[str, Step]], evidence: dict[str, Any]) -> Verdict:
    """One verdict from the rungs: fail if any rung failed, else pass if any passed, else unknown;
    it stands on the highest rung that gave a definitive answer."""
    definitive = [(n, s) for n, s in steps if s.result in ("pass", "fail")]
    rung = definitive[-1][0] if definitive else "none"
    fails = [s.reason for _, s in steps if s.result == "fail"]
    if fails:
        result, reason = "fail", "; ".join(fails)
    elif definitive:
        result = "pass"
        # the pass, and why the rungs above it could not confirm it
        above = [s.reason for n, s in steps if rung_index(n) > rung_index(rung) and s.result == "unknown"]
        reason = "; ".join([definitive[-1][1].reason, *above])
    else:
        result = "unknown"
        reason = "; ".join(s.reason for _, s in steps if s.result != "skip") or "no rung could look"
    return Verdict(
        kernel.id, arch.name, result, rung, reason, 0.0, asked=level,
        steps=[s.to_dict(n) for n, s in steps], evidence=evidence,
    )  # fmt: skip


def probe_recipe(
    needs: Sequence[str],
    archs: Sequence[Arch],
    fi: FlashInferEnv,
    level: str = "spec",
    cache: ProbeCache | None = None,
    catalogue: dict[str, Kernel] | None = None,
) -> list[Verdict]:
    """One verdict per (need, arch); the recipe may stay only if `recipe_passes` says so."""
    prefetch_spec(needs, archs, fi, level, cache, catalogue)
    return [probe_kernel(n, a, fi, level, cache, catalogue) for n in needs for a in archs]


def prefetch_spec(
    kernel_ids: Sequence[str],
    archs: Sequence[Arch],
    fi: FlashInferEnv,
    level: str,
    cache: ProbeCache | None = None,
    catalogue: dict[str, Kernel] | None = None,
) -> None:
    """Ask FlashInfer every spec question these probes will have in one go (one interpreter per arch,
    not one per check), skipping those a cached verdict or the catalogue already answers."""
    if level not in RUNGS or rung_index(level) < rung_index("spec") or not fi.found or not fi.python:
        return
    from sm120patch.probes.evidence import changes
    from sm120patch.probes.spec import Ask, build_ask, prefetch
    from sm120patch.probes.static import check_static

    commands = rung_index(level) >= rung_index("build")
    asks = []
    for kid in dict.fromkeys(kernel_ids):
        kernel = get_kernel(kid, catalogue)
        for arch in archs:
            if kernel.absent_on(arch) or (cache and (hit := cache.get(_cache_key(kernel, arch, fi, level)))
                                          and not changes(hit.get("evidence") or {}, fi)):  # fmt: skip
                continue
            static = check_static(kernel, arch, fi)
            if static.result == "fail" and static.final:
                continue  # the ladder stops before the spec rung
            asks.append(build_ask(kernel, arch) if commands else Ask(kernel, arch))
    if len(asks) > 1:
        prefetch(asks, fi, Path(cache.root) if cache else None)


def recipe_passes(verdicts: Sequence[Verdict]) -> bool:
    """Every need passed for every arch (an unknown is not a pass)."""
    return all(v.result == "pass" for v in verdicts)
