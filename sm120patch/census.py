"""Census of an environment's compiled CUDA code: can these GPUs run it, and if not, what to install.

Users on SM12x most often die on "no kernel image is available for execution on the device"
from a wheel that simply has no code for their GPU. This walks every distribution installed
in a site-packages (its dist-info RECORD names its files), reads the fatbin headers of its
shared objects and its loose cubins (elf.py: seeks, never whole files), and judges each
module per GPU with the loader's rules (archcompat.py). It also finds the ptxas Triton
would use and its CUDA version.

Fast enough for every start: each file's reading is cached by (size, mtime, inode), each
RECORD's list of candidate files too, in one JSON file per site-packages under the probe
cache; a warm census stats files and reads nothing else. A cold one reports progress on
stderr once it has taken over two seconds.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120patch.arch import Arch
from sm120patch.archcompat import Code, Verdict, judge, sort_names

SCHEMA = 2
PROGRESS_AFTER_S = 2.0
_CANDIDATE = re.compile(r"(\.so(\.\d+)*|\.cubin|\.fatbin)$")
_SITE_SCRIPT = "import json, sysconfig; p = sysconfig.get_paths(); print(json.dumps([p['purelib'], p['platlib']]))"


def cache_dir() -> Path:
    from sm120patch.probes.cache import default_cache_dir

    return default_cache_dir() / "census"


def site_packages_for(python: str | None) -> list[Path]:
    """The site-packages of `python` (this interpreter when None), purelib and platlib."""
    if python is None:
        import sysconfig

        paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    else:
        try:
            p = subprocess.run(
                [python, "-c", _SITE_SCRIPT], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
            )
            paths = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else []
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            paths = []
    out: list[Path] = []
    for s in paths:
        if Path(s).is_dir() and Path(s).resolve() not in out:
            out.append(Path(s).resolve())
    return out


def site_packages_of(path: Path) -> Path | None:
    """The site-packages holding an installed package tree (`.../site-packages/sglang`): the
    nearest folder at or above `path` that holds a `*.dist-info`."""
    for d in [path, *path.parents]:
        if d.is_dir() and any(d.glob("*.dist-info")):
            return d
    return None


@dataclass
class _Cache:
    path: Path
    files: dict[str, list[Any]] = field(default_factory=dict)  # rel path -> [size, mtime_ns, ino, result]
    records: dict[str, list[Any]] = field(default_factory=dict)  # dist-info -> [size, mtime_ns, ino, files]
    dirty: bool = False

    @classmethod
    def load(cls, root: Path, site: Path) -> _Cache:
        key = hashlib.sha256(str(site).encode()).hexdigest()[:24]
        c = cls(root / f"{key}.json")
        try:
            data = json.loads(c.path.read_text(encoding="utf-8"))
            if data.get("schema") == SCHEMA and data.get("site") == str(site):
                c.files, c.records = data["files"], data["records"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        return c

    def save(self, site: Path) -> None:
        if not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"schema": SCHEMA, "site": str(site), "files": self.files, "records": self.records}, f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # a cache that cannot be written only costs time


def _valid(hit: Any) -> bool:
    """A cache entry of the shape this version writes (anything else is re-read, not trusted)."""
    return (
        isinstance(hit, list)
        and len(hit) == 4
        and isinstance(hit[3], dict)
        and isinstance(hit[3].get("groups"), list)
        and isinstance(hit[3].get("error"), str)
    )


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


@dataclass
class Dist:
    name: str
    version: str
    dist_info: str
    files: list[str]  # candidate files (relative to site-packages)


def _dist_name(dist_info: str) -> tuple[str, str]:
    stem = dist_info[: -len(".dist-info")]
    name, _, version = stem.partition("-")
    return re.sub(r"[-_.]+", "-", name).lower(), version


def _record_files(record: Path) -> list[str]:
    out = []
    try:
        text = record.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        rel = line.rsplit(",", 2)[0] if line.count(",") >= 2 else line
        rel = rel.strip().strip('"')
        if _CANDIDATE.search(rel) and not rel.startswith(".."):
            out.append(rel)
    return out


def distributions(site: Path, cache: _Cache) -> tuple[list[Dist], list[str]]:
    """Each dist-info's candidate files (from RECORD, cached by RECORD's stamp); notes."""
    dists, notes = [], []
    try:
        infos = sorted(e.name for e in os.scandir(site) if e.name.endswith(".dist-info") and e.is_dir())
    except OSError as e:
        return [], [f"{site}: {e.strerror or e}"]
    for info in infos:
        record = site / info / "RECORD"
        name, version = _dist_name(info)
        try:
            stamp = _stamp(record.stat())
        except OSError:
            notes.append(f"{info}: no RECORD, so its files are not known (not censused)")
            continue
        hit = cache.records.get(info)
        if isinstance(hit, list) and len(hit) == 4 and isinstance(hit[3], list) and hit[:3] == stamp:
            files = hit[3]
        else:
            files = _record_files(record)
            cache.records[info] = [*stamp, files]
            cache.dirty = True
        dists.append(Dist(name, version, info, files))
    return dists, notes


def _read(path: Path) -> dict[str, Any]:
    """One file's code, compactly: identical translation units grouped with a count."""
    from sm120patch.elf import read_file_code

    code = read_file_code(path)
    units: dict[int, list[str]] = {}
    for e in code.entries:
        units.setdefault(e.container, []).append(e.code)
    groups: dict[tuple[str, ...], int] = {}
    for codes in units.values():
        sig = tuple(sorted(set(codes)))
        groups[sig] = groups.get(sig, 0) + 1
    return {
        "kind": code.kind,
        "groups": [[list(sig), n] for sig, n in sorted(groups.items())],
        "compressed": any(e.compressed for e in code.entries),
        "error": code.error,
    }


class _Progress:
    """Says how far a cold census has got, on stderr, once it has run PROGRESS_AFTER_S."""

    def __init__(self, total: int, stream: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.clock, self.stream = total, clock, stream if stream is not None else sys.stderr
        self.start = self.last = clock()
        self.shown = False

    def tick(self, done: int, what: str) -> None:
        now = self.clock()
        if now - self.start >= PROGRESS_AFTER_S and now - self.last >= 1.0:
            self.last, self.shown = now, True
            print(f"census: {done}/{self.total} files checked ({what})", file=self.stream, flush=True)

    def finish(self, read: int) -> None:
        if self.shown:
            print(f"census: done, {read} files read in {self.clock() - self.start:.1f} s", file=self.stream)


def scan_site(site: Path, cache_root: Path | None = None, progress: Any = None) -> dict[str, Any]:
    """Every distribution in `site` that carries CUDA code, with each module's images, from
    the cache where the file is as it was."""
    t0 = time.monotonic()
    cache = _Cache.load(cache_root or cache_dir(), site)
    dists, notes = distributions(site, cache)
    total = sum(len(d.files) for d in dists)
    prog = _Progress(total, progress)
    read = cached = done = 0
    out = []
    seen: dict[str, list[Any]] = {}
    for d in dists:
        modules = []
        for rel in d.files:
            done += 1
            p = os.path.join(site, rel)
            try:
                stamp = _stamp(os.stat(p))
            except OSError:
                continue  # RECORD lists it, the file is gone: nothing to load, nothing to fail
            hit = cache.files.get(rel)
            if _valid(hit) and hit[:3] == stamp:
                res, cached = hit[3], cached + 1
            else:
                res, read = _read(Path(p)), read + 1
                cache.dirty = True
                prog.tick(done, d.name)
            seen[rel] = [*stamp, res]
            if res["groups"] or res["error"]:
                modules.append({"path": rel, **res})
        if modules:
            out.append({"name": d.name, "version": d.version, "modules": modules})
    if set(seen) != set(cache.files):
        cache.dirty = True  # files gone since the last census leave the cache with them
    cache.files = seen
    cache.save(site)
    prog.finish(read)
    return {
        "site": str(site),
        "distributions": out,
        "notes": notes,
        "files_read": read,
        "files_cached": cached,
        "elapsed_s": round(time.monotonic() - t0, 3),
    }


# --- verdicts --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _code(text: str) -> Code:
    return Code.parse(text)


def _codes(sig: Iterable[str]) -> list[Code]:
    return [_code(c) for c in sig]


def module_verdict(module: dict[str, Any], gpu: Arch, driver: str | None) -> dict[str, Any]:
    """See `_verdict`; modules built alike (thousands of cubins of a few kinds) are judged once."""
    key = tuple((tuple(sig), n) for sig, n in module["groups"])
    return dict(_verdict(key, gpu, driver))


@functools.lru_cache(maxsize=4096)
def _verdict(groups_key: tuple[tuple[tuple[str, ...], int], ...], gpu: Arch, driver: str | None) -> dict[str, Any]:
    """Whether a module's code runs on `gpu`: `ok`, `partial` (some translation units have no
    image: the ops they hold fail) or `none`.

    nvcc's device-link unit never holds PTX (seen with nvcc 13.0 in the tests), so where the
    module runs only by JIT, units without PTX are not counted as missing."""
    groups = [(_codes(sig), n) for sig, n in groups_key]
    whole: Verdict = judge([c for codes, _ in groups for c in codes], gpu, driver)
    units = sum(n for _, n in groups)
    missing, first_missing = 0, None
    for codes, n in groups:
        v = judge(codes, gpu, driver)
        if not v.ok and not (whole.how == "jit" and not any(c.kind == "ptx" for c in codes)):
            missing += n
            first_missing = first_missing or v
    status = "none" if not whole.ok else "partial" if missing else "ok"
    why, error = whole.why, whole.error
    if status == "partial" and first_missing is not None:
        why, error = f"{missing} of {units} translation units: {first_missing.why}", first_missing.error
    return {
        "status": status,
        "how": whole.how,
        "image": whole.image,
        "units": units,
        "missing_units": missing,
        "error": error,
        "why": why,
    }


def _all_codes(modules: Sequence[dict[str, Any]]) -> list[Code]:
    return _codes({c for m in modules for sig, _ in m["groups"] for c in sig})


def _images(modules: Sequence[dict[str, Any]], kind: str) -> list[str]:
    return sort_names({c.name for c in _all_codes(modules) if c.kind == kind})


def _ptx_isas(modules: Sequence[dict[str, Any]]) -> list[str]:
    isas = {c.isa for c in _all_codes(modules) if c.kind == "ptx" and c.isa}
    return sorted(isas, key=lambda s: tuple(int(x) for x in s.split(".")))


def judge_site(scan: dict[str, Any], archs: Sequence[Arch], driver: str | None) -> list[dict[str, Any]]:
    """Per distribution: the images it carries and, per GPU, what runs and the fix for what does not."""
    from sm120patch.census_fixes import fix_for

    rows = []
    for d in scan["distributions"]:
        mods = d["modules"]
        per_gpu: dict[str, Any] = {}
        for a in archs:
            verdicts = {m["path"]: module_verdict(m, a, driver) for m in mods if m["groups"]}
            none = sorted(p for p, v in verdicts.items() if v["status"] == "none")
            partial = sorted(p for p, v in verdicts.items() if v["status"] == "partial")
            jit = sorted(p for p, v in verdicts.items() if v["status"] != "none" and v["how"] == "jit")
            status = (
                "none" if none and len(none) == len(verdicts) else "some" if none else ("partial" if partial else "ok")
            )
            if status == "ok" and jit:
                status = "jit"  # runs, but only after the driver JIT-compiles PTX at first load
            errors = sorted({verdicts[p]["error"] for p in none + partial if verdicts[p]["error"]})
            per_gpu[a.name] = {
                "status": status,
                "cannot_run": none,
                "partial": partial,
                "jit": jit,
                "modules": verdicts,
                "you_will_see": [f"CUDA error: {e}" for e in errors],
                "fix": fix_for(d["name"], d["version"], a, _images(mods, "sass")) if none or partial else "",
            }
        rows.append(
            {
                "name": d["name"],
                "version": d["version"],
                "modules": [m["path"] for m in mods],
                "unreadable": [{"path": m["path"], "error": m["error"]} for m in mods if m["error"]],
                "sass": _images(mods, "sass"),
                "ptx": _images(mods, "ptx"),
                "ptx_isa": _ptx_isas(mods),
                "gpus": per_gpu,
            }
        )
    return rows


# --- Triton's ptxas --------------------------------------------------------------------------


def triton_ptxas(sites: Sequence[Path], env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The ptxas Triton would run (TRITON_PTXAS_PATH, else the one bundled under
    triton/backends/nvidia/bin, else triton/third_party/cuda/bin for Triton < 3.0), its CUDA
    release from `ptxas --version`; None when Triton is not installed and no override is set."""
    env = os.environ if env is None else env
    override = env.get("TRITON_PTXAS_PATH")
    if override:
        path, source = Path(override), "TRITON_PTXAS_PATH"
    else:
        found = [
            s / rel
            for s in sites
            for rel in ("triton/backends/nvidia/bin/ptxas", "triton/third_party/cuda/bin/ptxas")
            if (s / rel).is_file()
        ]
        if not found:
            return None
        path, source = found[0], "bundled with triton"
    info: dict[str, Any] = {"path": str(path), "source": source, "cuda": None, "error": ""}
    try:
        p = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL
        )
        m = re.search(r"release (\d+\.\d+)", p.stdout)
        info["cuda"] = m.group(1) if m else None
        if not m:
            info["error"] = f"`{path} --version` said no release (exit {p.returncode})"
    except (OSError, subprocess.SubprocessError) as e:
        info["error"] = f"{path}: {e}"
    return info


def ptxas_targets(info: dict[str, Any], archs: Sequence[Arch]) -> dict[str, dict[str, Any]]:
    """Whether that ptxas knows the `sm_XYa` Triton compiles for (Triton targets sm_120a on 12.0,
    sm_121a on 12.1); the error it gives when not (diagnose: ptxas-unknown-sm12x)."""
    from sm120patch.device import CudaToolkit, can_build_for

    out = {}
    for a in archs:
        ok, why = can_build_for(CudaToolkit(version=info.get("cuda"), nvcc=info["path"]), a)
        target = f"{a.name}a" if a.major >= 9 else a.name
        out[a.name] = {
            "ok": ok,
            "why": why.replace("nvcc", "ptxas"),
            "you_will_see": "" if ok else f"ptxas fatal   : Value '{target}' is not defined for option 'gpu-name'",
        }
    return out


# --- the whole report ------------------------------------------------------------------------


def census(
    sites: Sequence[Path],
    archs: Sequence[Arch],
    driver: str | None = None,
    cache_root: Path | None = None,
    progress: Any = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The census section of preflight's report (JSON-ready)."""
    t0 = time.monotonic()
    scans = [scan_site(s, cache_root, progress) for s in sites]
    rows = [r for s in scans for r in judge_site(s, archs, driver)]
    ptxas = triton_ptxas(sites, env)
    if ptxas is not None:
        ptxas["targets"] = ptxas_targets(ptxas, archs)
    problems = [
        {
            "package": r["name"],
            "version": r["version"],
            "gpu": a,
            "status": g["status"],
            "modules": g["cannot_run"] + g["partial"],
            "you_will_see": g["you_will_see"],
            "fix": g["fix"],
        }
        for r in rows
        for a, g in r["gpus"].items()
        if g["status"] not in ("ok", "jit")
    ]
    return {
        "site_packages": [str(s) for s in sites],
        "archs": [a.name for a in archs],
        "driver": driver,
        "distributions": rows,
        "problems": problems,
        "ptxas": ptxas,
        "notes": [n for s in scans for n in s["notes"]],
        "files_read": sum(s["files_read"] for s in scans),
        "files_cached": sum(s["files_cached"] for s in scans),
        "elapsed_s": round(time.monotonic() - t0, 3),
    }


_STATUS = {"ok": "ok", "jit": "ok (JIT)", "partial": "partial", "some": "SOME", "none": "NO"}


def _span(names: list[str]) -> str:
    return " ".join(names) if len(names) <= 6 else f"{names[0]} .. {names[-1]} ({len(names)})"


def render_lines(report: dict[str, Any]) -> list[str]:
    """The census part of preflight's text: a table, then per problem what you will see and the fix."""
    rows = report["distributions"]
    where = ", ".join(report["site_packages"]) or "no site-packages found"
    out = [
        f"census: {len(rows)} distributions with CUDA code in {where} "
        f"({report['files_read']} files read, {report['files_cached']} from cache, {report['elapsed_s']:.2f} s)"
    ]
    pt = report.get("ptxas")
    if pt:
        targets = ", ".join(
            f"{a} {'yes' if t['ok'] else 'no (' + t['why'] + ')'}" for a, t in (pt.get("targets") or {}).items()
        )
        out.append(f"  Triton's ptxas: {pt['path']} ({pt['source']}; CUDA {pt['cuda'] or '?'}) {targets}".rstrip())
        if pt.get("error"):
            out.append(f"    {pt['error']}")
    else:
        out.append("  Triton's ptxas: triton not installed and TRITON_PTXAS_PATH not set")
    if rows:
        w = max(len(r["name"]) for r in rows)
        archs = report["archs"]
        out.append(f"  {'package':<{w}}  {'version':<14} " + " ".join(f"{a:<8}" for a in archs) + "  SASS / PTX")
        for r in rows:
            cells = " ".join(f"{_STATUS[r['gpus'][a]['status']]:<8}" for a in archs)
            ptx = _span(r["ptx"]) + (f" (ISA {', '.join(r['ptx_isa'])})" if r["ptx_isa"] else "") if r["ptx"] else "-"
            out.append(f"  {r['name']:<{w}}  {r['version'][:14]:<14} {cells}  {_span(r['sass']) or '-'} / {ptx}")
    for p in report["problems"]:
        mods = p["modules"]
        shown = ", ".join(mods[:4]) + (f" and {len(mods) - 4} more" if len(mods) > 4 else "")
        what = "have no image for" if p["status"] in ("none", "some") else "lack code in some translation units for"
        out.append(f"  {p['package']} {p['version']} on {p['gpu']}: {shown} {what} {p['gpu']}")
        for e in p["you_will_see"]:
            out.append(f"    you will see: {e}")
        if p["fix"]:
            out.append(f"    fix: {p['fix']}")
    for r in rows:
        for u in r["unreadable"]:
            out.append(f"  note: {r['name']}: {u['path']} could not be read ({u['error']}); not judged")
    for n in report["notes"]:
        out.append(f"  note: {n}")
    return out


def sites_for(given: Sequence[Path] = (), python: str | None = None, package_dirs: Sequence[Path] = ()) -> list[Path]:
    """Which site-packages preflight censuses: those given (--site-packages), else --python's,
    else the ones holding the packages it checks, else this interpreter's."""
    if given:
        return [Path(g).resolve() for g in given]
    if python is not None:
        return site_packages_for(python)
    found: list[Path] = []
    for d in package_dirs:
        s = site_packages_of(Path(d))
        if s is not None and s.resolve() not in found:
            found.append(s.resolve())
    return found or site_packages_for(None)


def for_preflight(
    machine: Any, archs: Sequence[Arch], python: str | None, package_dirs: Sequence[Path], given: Sequence[Path] = ()
) -> dict[str, Any]:
    """preflight's census: the detected GPUs' archs (else the planned ones), the driver it saw."""
    from sm120patch.device import archs_present

    gpus = archs_present(machine) or list(archs)
    return census(sites_for(given, python, package_dirs), gpus, machine.driver)


def recipe_notes(report: dict[str, Any], needs: dict[str, Sequence[str]]) -> dict[str, list[str]]:
    """Per recipe id: where a kernel it needs lives in a censused module that cannot run on a GPU
    (the kernel catalogue's `jit_modules`, a module `<m>.so` or folder `<m>/`, and `cubin_globs`,
    under a `cubins/` folder), one line each, naming the package, the module and the fix."""
    from sm120patch.errors import UserError
    from sm120patch.kernels import load_kernels

    try:
        catalogue = load_kernels()
    except UserError:  # a broken catalogue is the probes' to report, not the census's
        return {}
    out: dict[str, list[str]] = {}
    for rid, kernel_ids in needs.items():
        lines: list[str] = []
        for kid in kernel_ids:
            k = catalogue.get(kid)
            if k is None:
                continue
            for d in report["distributions"]:
                for gpu, g in d["gpus"].items():
                    bad = [p for p in g["cannot_run"] + g["partial"] if _holds(p, k.jit_modules, k.cubin_globs)]
                    if bad:
                        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
                        lines.append(
                            f"{kid} lives in {d['name']} {d['version']} ({shown}), which has no {gpu} image there: "
                            f"{'; '.join(g['you_will_see'])}; fix: {g['fix']}"
                        )
        if lines:
            out[rid] = lines
    return out


def _holds(rel: str, jit_modules: Sequence[str], cubin_globs: Sequence[str]) -> bool:
    p = Path(rel)
    if any(p.name.split(".")[0] == m or m in p.parts[:-1] for m in jit_modules):
        return True
    if "cubins" in p.parts:
        under = "/".join(p.parts[p.parts.index("cubins") + 1 :])
        return any(fnmatch.fnmatch(under, g) for g in cubin_globs)
    return False
