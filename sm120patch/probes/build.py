"""Build rung (opt-in): compile the module's kernels for the arch, then read the machine code.

FlashInfer says how it would compile the module (`JitSpec.get_compile_commands()`, asked in
a subprocess of the target Python); each CUDA translation unit is compiled here for the
arch with the CUDA toolkit at hand, device code only (`nvcc -cubin`: no host compiler
output, no link, no GPU), so SM12x kernels are built on any machine with CUDA >= 12.9.
The cubins are then read back: they must hold SASS for the arch, and no kernel may be as
small as an empty one. Compiling is not proof: FlashInfer <= 0.6.16 built its SM12x
Lamport all-reduce kernels with their bodies preprocessed away, and they "ran" without
computing anything. What no cubin shows (a launch configuration the device cannot run)
is the static rung's source checks.

Each translation unit's cubin is cached under the probe cache, keyed by the command (with
the FlashInfer location made relative), the nvcc version and the source, and validated
against the sha256 of every header nvcc reported it read: a warm verdict reads hashes only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sm120patch.arch import Arch
from sm120patch.catalogue.kernels import Kernel
from sm120patch.hashing import sha256_json
from sm120patch.probes.environment.device import CudaToolkit, can_build_for, find_cuda
from sm120patch.probes.environment.elf import ElfError, KernelCode, cubin_kernels, cubin_sm
from sm120patch.probes.environment.flashinfer import FlashInferEnv
from sm120patch.probes.rungs import Step
from sm120patch.probes.spec import NO_ARCH, answer_for, ask, build_ask
from sm120patch.probes.verdict_cache import file_digest as file_sha
from sm120patch.probes.verdict_cache import forget_digests

TIMEOUT_S = 3600.0  # per translation unit
SCHEMA = 2
FI = "<flashinfer>"  # stands for the FlashInfer package folder in cached commands and deps


@dataclass
class Unit:
    """One translation unit of the module: the source and the nvcc argv FlashInfer would use."""

    source: Path
    argv: list[str]


@dataclass
class Compiled:
    source: Path
    cubin: Path
    deps: dict[str, str]  # dep id (FI-relative or absolute path) -> sha256
    cached: bool
    seconds: float = 0.0
    error: str = ""


@dataclass
class Findings:
    """What the cubins hold, across the module's translation units."""

    sms: set[int] = field(default_factory=set)
    kernels: list[KernelCode] = field(default_factory=list)
    empty: list[KernelCode] = field(default_factory=list)

    def empty_by_family(self) -> list[tuple[str, int, int]]:
        """(family, empty, all) for every family with an empty instantiation, most first."""
        total = Counter(k.family for k in self.kernels)
        empty = Counter(k.family for k in self.empty)
        return [(f, n, total[f]) for f, n in empty.most_common()]


# --- asking FlashInfer how it compiles the module ---------------------------------------------------


def _units(kernel: Kernel, arch: Arch, fi: FlashInferEnv, cuda: CudaToolkit, cache_root: Path) -> Step | list[Unit]:
    """FlashInfer's compile commands for the module: asked once, then read back from the answer cache
    while none of the Python files that produced them changed (and every source they name exists)."""
    a = build_ask(kernel, arch, cuda)
    p = answer_for(a, fi, cache_root)
    if p.get("ok") and "commands" in p and not all(Path(c["file"]).is_file() for c in p["commands"]):
        p = ask([a], fi, cache_root, use_cache=False).get(a) or {}  # a source it generated is gone
    if p.get("stage") in ("crash", "timeout"):
        return Step("unknown", f"build: asking {kernel.module}.{kernel.generator}(): {p.get('error')}")
    if not p.get("ok"):
        err = str(p.get("error", ""))
        if NO_ARCH in err:
            return Step("fail", f"build: {kernel.generator}() raised {err}")
        return Step("unknown", f"build: asking {kernel.module}.{kernel.generator}() failed: {err[-300:]}")
    if "commands" not in p:
        why = p.get("commands_error", "no commands")
        return Step("unknown", f"build: this FlashInfer cannot list its compile commands ({why})")
    units = [Unit(Path(c["file"]), list(c["argv"])) for c in p["commands"] if str(c["file"]).endswith(".cu")]
    if not units:
        return Step("unknown", f"build: {kernel.generator}() lists no CUDA sources")
    return units


# --- compiling, with a cache keyed by what nvcc read ------------------------------------------------


def _device_argv(argv: Sequence[str], out: Path, depfile: Path) -> list[str]:
    """FlashInfer's `nvcc -c ... -o X` as device-code-only `nvcc -cubin ... -o OUT`, with a depfile."""
    a = list(argv)
    a[a.index("-c")] = "-cubin"
    o = a.index("-o")
    a[o + 1] = str(out)
    return [*a, "--generate-dependencies-with-compile", "--dependency-output", str(depfile)]


def _normalise(text: str, package_dir: Path) -> str:
    return text.replace(str(package_dir), FI)


def _dep_id(path: str, package_dir: Path) -> str:
    p = str(Path(path).resolve())
    root = str(package_dir.resolve())
    return FI + p[len(root) :] if p.startswith(root + os.sep) else p


def _dep_path(dep: str, package_dir: Path) -> Path:
    return package_dir / dep[len(FI) + 1 :] if dep.startswith(FI + "/") else Path(dep)


def _read_depfile(path: Path) -> list[str]:
    """Make-style `out: a b \\` lines -> the paths after the colon."""
    text = path.read_text(errors="replace").replace("\\\n", " ")
    deps: list[str] = []
    for line in text.splitlines():
        if ":" in line:
            deps += line.split(":", 1)[1].split()
    return deps


def _key(unit: Unit, package_dir: Path, nvcc: str, nvcc_version: str | None) -> str:
    argv = list(unit.argv)
    if "-o" in argv:
        del argv[argv.index("-o") : argv.index("-o") + 2]
    blob = {
        "schema": SCHEMA,
        "argv": [_normalise(a, package_dir) for a in argv],
        "nvcc": [nvcc, nvcc_version],
        "source": [_dep_id(str(unit.source), package_dir), file_sha(unit.source)],
    }
    return sha256_json(blob, sort_keys=True)[:32]


def _lookup(folder: Path, package_dir: Path) -> Compiled | None:
    try:
        entries = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    for e in entries if isinstance(entries, list) else []:
        deps = e.get("deps", {})
        if all(file_sha(_dep_path(d, package_dir)) == sha for d, sha in deps.items()):
            cubin = folder / e["cubin"]
            if cubin.is_file():
                return Compiled(Path(e["source"]), cubin, deps, cached=True)
    return None


def _store(folder: Path, staged: Path, compiled: Compiled) -> Compiled:
    """Move a finished cubin into the cache and add its entry (atomic renames only)."""
    folder.mkdir(parents=True, exist_ok=True)
    digest = file_sha(staged)
    final = folder / f"{digest}.cubin"
    os.replace(staged, final)
    try:
        entries = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        entries = []
    entries = [e for e in entries if e.get("deps") != compiled.deps]
    entries.append({"source": str(compiled.source), "cubin": final.name, "deps": compiled.deps})
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".manifest-")
    with os.fdopen(fd, "w") as f:
        json.dump(entries, f)
    os.replace(tmp, folder / "manifest.json")
    compiled.cubin = final
    return compiled


def _run_nvcc(argv: list[str], timeout: float) -> tuple[int | None, str]:
    """Run nvcc in its own process group; a timeout or Ctrl-C kills it and its children."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if sys.exc_info()[0] is subprocess.TimeoutExpired:
            return None, f"nvcc did not finish within {timeout:.0f} s"
        raise
    return proc.returncode, out or ""


def _compile(unit: Unit, package_dir: Path, cache: Path, nvcc_version: str | None, timeout: float) -> Compiled:
    nvcc = unit.argv[0]
    folder = cache / _key(unit, package_dir, nvcc, nvcc_version)
    if hit := _lookup(folder, package_dir):
        return hit
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.partial-"))
    try:
        out, depfile = staging / "tu.cubin", staging / "tu.d"
        start = time.monotonic()
        code, log = _run_nvcc(_device_argv(unit.argv, out, depfile), timeout)
        seconds = time.monotonic() - start
        if code != 0 or not out.is_file():
            return Compiled(unit.source, out, {}, False, seconds, log.strip()[-400:] or f"nvcc exited {code}")
        deps = {_dep_id(d, package_dir): file_sha(Path(d)) for d in _read_depfile(depfile)}
        return _store(folder, out, Compiled(unit.source, out, deps, False, seconds))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _compile_all(
    units: Sequence[Unit], package_dir: Path, cache: Path, nvcc_version: str | None, timeout: float, progress: str
) -> list[Compiled]:
    """Every unit, in parallel up to the CPU count, with a progress line on a terminal."""
    done: list[Compiled] = []
    stop = threading.Event()
    show = sys.stderr.isatty()
    start = time.monotonic()

    def tick() -> None:
        while not stop.wait(1.0):
            sys.stderr.write(f"\r{progress}: {len(done)}/{len(units)} units, {time.monotonic() - start:4.0f} s")
            sys.stderr.flush()

    ticker = threading.Thread(target=tick, daemon=True) if show else None
    if ticker:
        ticker.start()
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(len(units), os.cpu_count() or 1))) as pool:
            for c in pool.map(lambda u: _compile(u, package_dir, cache, nvcc_version, timeout), units):
                done.append(c)
    finally:
        stop.set()
        if ticker:
            ticker.join()
            sys.stderr.write(f"\r{progress}: {len(done)}/{len(units)} units, {time.monotonic() - start:4.0f} s\n")
    return done


# --- reading the machine code back ------------------------------------------------------------------


def _gencode(argv: Sequence[str]) -> list[str]:
    return [a for a in argv if a.startswith(("-gencode", "--gpu-architecture", "-arch"))]


def empty_kernel_size(nvcc: str, gencode: Sequence[str], cache: Path) -> int | None:
    """Bytes of machine code an empty kernel gets from this nvcc for this target: the size a
    kernel whose body was compiled out has too. Measured once per toolkit and target."""
    key = sha256_json([nvcc, file_sha(Path(nvcc)), list(gencode)])[:24]
    marker = cache / f"empty-{key}.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        return int(json.loads(marker.read_text())["size"])
    with tempfile.TemporaryDirectory(prefix="sm120patch-empty-") as tmp:
        src, out = Path(tmp) / "empty.cu", Path(tmp) / "empty.cubin"
        src.write_text('extern "C" __global__ void sm120patch_empty_kernel() {}\n')
        code, _ = _run_nvcc([nvcc, "-cubin", *gencode, "-O3", "-o", str(out), str(src)], 300.0)
        if code != 0 or not out.is_file():
            return None
        sizes = [k.size for k in cubin_kernels(out.read_bytes())]
    if not sizes:
        return None
    cache.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"size": sizes[0]}))
    return sizes[0]


def read_cubins(cubins: Sequence[Path], empty_size: int) -> Findings:
    f = Findings()
    for path in cubins:
        data = path.read_bytes()
        f.sms.add(cubin_sm(data))
        for k in cubin_kernels(data):
            f.kernels.append(k)
            if k.size <= empty_size:
                f.empty.append(k)
    return f


def judge(findings: Findings, arch: Arch, where: str) -> Step:
    """The verdict on what the cubins hold: SASS for the arch, and no kernel with an empty body."""
    sm = arch.major * 10 + arch.minor
    if sm not in findings.sms:
        return Step("fail", f"build: the cubins hold SASS for {sorted(findings.sms)}, not sm_{sm} ({where})")
    if not findings.kernels:
        return Step("unknown", f"build: the cubins hold no kernels ({where})")
    if findings.empty:
        parts = [f"{n} of {total} {family} instantiations" for family, n, total in findings.empty_by_family()]
        return Step(
            "fail",
            f"build: {', '.join(parts)} have an empty body for {arch.name}: the source compiles them out "
            f"for this arch, so they would run and compute nothing ({where})",
        )
    return Step(
        "pass",
        f"build: {len(findings.kernels)} kernels with sm_{sm} SASS, none with an empty body ({where})",
    )


# --- the rung -----------------------------------------------------------------------------------------


def check_build(kernel: Kernel, arch: Arch, fi: FlashInferEnv, cache_root: Path, timeout: float = TIMEOUT_S) -> Step:
    """Compile the kernel's module for `arch` (cached), then judge its cubins."""
    forget_digests()
    if not fi.python or fi.package_dir is None:
        return Step(
            "unknown",
            "build: no Python interpreter to ask this FlashInfer how it compiles the module: pass --python EXE "
            "(the server's Python, with torch)",
        )
    cuda = find_cuda()
    family = arch.major == 12 and arch.minor == 0
    ok, why = can_build_for(cuda, arch, family=family)
    if not ok and not (family and can_build_for(cuda, arch)[0]):
        return Step("unknown", f"build: {why}")
    if cuda.nvcc is None:
        return Step("unknown", "build: no nvcc")
    units = _units(kernel, arch, fi, cuda, cache_root)
    if isinstance(units, Step):
        return units
    cache = cache_root / "builds" / "cubins"
    progress = f"building {kernel.id} for {arch.name}"
    compiled = _compile_all(units, fi.package_dir, cache, cuda.version, timeout, progress)
    failed = [c for c in compiled if c.error]
    if failed:
        c = failed[0]
        return Step("unknown", f"build: nvcc failed on {c.source.name}: {c.error}", final=False)
    empty = empty_kernel_size(cuda.nvcc, _gencode(units[0].argv), cache_root / "builds")
    if empty is None:
        return Step("unknown", "build: could not compile an empty reference kernel with this nvcc")
    try:
        findings = read_cubins([c.cubin for c in compiled], empty)
    except (OSError, ElfError) as e:
        return Step("unknown", f"build: cannot read the cubins ({e})")
    fresh = sum(not c.cached for c in compiled)
    where = f"{len(units)} translation units, {' '.join(_gencode(units[0].argv))}, CUDA {cuda.version}; " + (
        f"{fresh} compiled in {sum(c.seconds for c in compiled):.0f} s" if fresh else "all from cache"
    )
    step = judge(findings, arch, where)
    files = {d[len(FI) + 1 :]: sha for c in compiled for d, sha in c.deps.items() if d.startswith(FI + "/")}
    step.evidence = {
        "files": files,
        "build": {
            "units": [_dep_id(str(c.source), fi.package_dir) for c in compiled],
            "kernels": len(findings.kernels),
            "empty": [{"family": f, "empty": n, "of": t} for f, n, t in findings.empty_by_family()],
            "empty_size": empty,
            "sms": sorted(findings.sms),
            "cuda": cuda.version,
        },
    }
    return step
