"""The probe ladder: do the kernels a recipe needs exist for this arch, and how sure are we?

Rungs, cheapest first: static (read the generator's arch gate), artifact (read ELF/fatbin
headers of prebuilt kernels), spec (ask FlashInfer in a subprocess), build (nvcc, opt-in),
run (the GPU, opt-in). The ladder climbs up to `level`, stops at the first definitive
fail, and every verdict says which rung it stands on: a static pass is a weaker claim
than a build, and only a run catches a kernel that compiles to garbage.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from sm120patch.arch import Arch
from sm120patch.errors import UserError
from sm120patch.flashinfer_env import FlashInferEnv
from sm120patch.kernels import Kernel, get_kernel
from sm120patch.probes.artifact import jit_module_files, scan_cubins, scan_paths
from sm120patch.probes.build import check_build
from sm120patch.probes.cache import ProbeCache, default_cache_dir
from sm120patch.probes.run import check_run
from sm120patch.probes.spec import check_spec
from sm120patch.probes.static import read_gate

__all__ = ["LEVELS", "ProbeCache", "Verdict", "probe_kernel", "probe_recipe", "recipe_passes"]

LEVELS = ("static", "artifact", "spec", "build", "run")
RESULTS = ("pass", "fail", "unknown")


@dataclass
class Verdict:
    kernel: str
    arch: str
    result: str  # pass / fail / unknown
    rung: str  # the highest rung that gave a definitive answer ("none" if none did)
    reason: str  # why the ladder stopped there
    elapsed_s: float
    cached: bool = False

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


Step = tuple[str, str]  # (pass / fail / unknown / skip, reason)


def _static(kernel: Kernel, arch: Arch, fi: FlashInferEnv) -> Step:
    assert fi.package_dir is not None
    path = fi.package_dir / kernel.file
    gate = read_gate(path, kernel.generator)
    if not gate.found:
        return "unknown", f"static: {kernel.generator} not found in {path}"
    if gate.dynamic:
        return "unknown", f"static: {gate.where} computes its arch gate; cannot read it"
    if gate.majors is None:
        return "pass", f"static: {gate.where} passes no arch gate (builds for any target)"
    majors = list(gate.majors)
    verb = "includes" if arch.major in majors else "excludes"
    result = "pass" if arch.major in majors else "fail"
    return result, (
        f"static: {gate.where} passes supported_major_versions={majors}, "
        f"which {verb} major {arch.major} ({arch.name}); FlashInfer {fi.version}"
    )


def _artifact(kernel: Kernel, arch: Arch, fi: FlashInferEnv) -> Step:
    roots = [p for p in (fi.jit_cache_dir, *fi.user_cache_dirs) if p]
    scan = scan_paths(jit_module_files(roots, kernel.jit_modules))
    sm = arch.major * 10 + arch.minor
    if sm in scan.sms:
        return "pass", f"artifact: prebuilt {scan.files_for(sm)[0]} holds sm_{sm} SASS"
    if scan.files:
        return "skip", f"artifact: prebuilt modules hold SASS for {scan.sms}, not sm_{sm}"
    return "skip", "artifact: no prebuilt module (JIT cache, ~/.cache/flashinfer) to read"


def _absent(kernel: Kernel, arch: Arch, fi: FlashInferEnv, level: int) -> Verdict | Step:
    """A kernel family that does not exist for `arch`: fail, with artifact evidence if asked."""
    head = kernel.why.strip().splitlines()[0]
    reason = f"kernels.toml: {kernel.id} does not exist for {arch.name} ({head})"
    rung = "static"
    if level >= LEVELS.index("artifact") and fi.cubin_dir and kernel.cubin_globs:
        scan = scan_cubins(fi.cubin_dir, kernel.cubin_globs)
        sm = arch.major * 10 + arch.minor
        if sm in scan.sms:
            return "unknown", (
                f"artifact: kernels.toml says {kernel.id} is absent on {arch.name}, "
                f"but {scan.files_for(sm)[0]} holds sm_{sm}: update kernels.toml"
            )
        if scan.files:
            rung = "artifact"
            reason += f"; artifact: {len(scan.files)} cubins in {fi.cubin_dir} are for SM {scan.sms}, none for sm_{sm}"
    return "fail", f"{rung}|{reason}"


def _cache_key(kernel: Kernel, arch: Arch, fi: FlashInferEnv, level: str) -> str:
    gen = (fi.package_dir / kernel.file) if fi.package_dir else None
    try:
        st = gen.stat() if gen else None
        stamp = (st.st_mtime_ns, st.st_size) if st else None
    except OSError:
        stamp = None
    return ProbeCache.key(
        {
            "kernel": repr(kernel),
            "arch": arch.name,
            "level": level,
            "version": fi.version,
            "location": fi.location,
            "generator_file": stamp,
            "python": fi.python,
            "sys_path": str(fi.sys_path),
            "source": fi.source,
            "cubin": str(fi.cubin_dir),
            "jit_cache": str(fi.jit_cache_dir),
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
    if level not in LEVELS:
        raise UserError(f"--probe {level!r}: unknown level; use one of {', '.join(LEVELS)}")
    start = time.monotonic()
    kernel = get_kernel(kernel_id, catalogue)

    def done(result: str, rung: str, reason: str) -> Verdict:
        return Verdict(kernel_id, arch.name, result, rung, reason, round(time.monotonic() - start, 3))

    if not fi.found:
        return done("unknown", "none", fi.error or "FlashInfer not found")
    key = _cache_key(kernel, arch, fi, level) if cache else ""
    if cache and (hit := cache.get(key)):
        return Verdict(
            kernel_id,
            arch.name,
            hit["result"],
            hit["rung"],
            hit["reason"],
            round(time.monotonic() - start, 3),
            cached=True,
        )
    verdict = _climb(kernel, arch, fi, LEVELS.index(level), cache, done)
    if cache and verdict.result in ("pass", "fail"):
        cache.put(key, verdict.to_dict())
    return verdict


def _climb(
    kernel: Kernel,
    arch: Arch,
    fi: FlashInferEnv,
    top: int,
    cache: ProbeCache | None,
    done: Callable[[str, str, str], Verdict],
) -> Verdict:
    if kernel.absent_on(arch):
        res, why = _absent(kernel, arch, fi, top)  # type: ignore[misc]
        if res == "fail":
            rung, reason = why.split("|", 1)
            return done("fail", rung, reason)
        return done(res, "artifact", why)
    cache_root = cache.root if cache else default_cache_dir()
    rungs: dict[str, Callable[[], Step]] = {
        "static": lambda: _static(kernel, arch, fi),
        "artifact": lambda: _artifact(kernel, arch, fi),
        "spec": lambda: check_spec(kernel, arch, fi),
        "build": lambda: check_build(kernel, arch, fi, Path(cache_root)),
        "run": lambda: check_run(kernel, arch, fi, Path(cache_root)),
    }
    result, rung, reason, after = "unknown", "none", "", []
    for name in LEVELS[: top + 1]:
        res, why = rungs[name]()
        if res == "skip":
            continue
        if res == "fail":
            return done("fail", name, why)
        if res == "pass":
            result, rung, reason, after = "pass", name, why, []
        else:
            after.append(why)
    if after:
        reason = "; ".join(filter(None, [reason, *after]))
    return done(result, rung, reason)


def probe_recipe(
    needs: Sequence[str],
    archs: Sequence[Arch],
    fi: FlashInferEnv,
    level: str = "spec",
    cache: ProbeCache | None = None,
    catalogue: dict[str, Kernel] | None = None,
) -> list[Verdict]:
    """One verdict per (need, arch); the recipe may stay only if `recipe_passes` says so."""
    return [probe_kernel(n, a, fi, level, cache, catalogue) for n in needs for a in archs]


def recipe_passes(verdicts: Sequence[Verdict]) -> bool:
    """Every need passed for every arch (an unknown is not a pass)."""
    return all(v.result == "pass" for v in verdicts)
