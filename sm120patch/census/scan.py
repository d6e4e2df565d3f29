"""Census of an environment's compiled CUDA code: can these GPUs run it, and if not, what to install.

Users on SM12x most often die on "no kernel image is available for execution on the device"
from a wheel that simply has no code for their GPU. This walks every distribution installed
in a site-packages (its dist-info RECORD names its files), reads the fatbin headers of its
shared objects and its loose cubins (elf.py: seeks, never whole files), and judges each
module per GPU with the loader's rules (census/rules.py, via verdicts.py). It also
finds the ptxas Triton would use (ptxas.py); render.py writes the text.

Fast enough for every start: each file's reading is cached by (size, mtime, inode), each
RECORD's list of candidate files too, in one JSON file per site-packages under the probe
cache; a warm census stats files and reads nothing else. A cold one reports progress on
stderr once it has taken over two seconds.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120patch.arch import Arch
from sm120patch.hashing import sha256_text

SCHEMA = 3
PROGRESS_AFTER_S = 2.0
# Distributions whose GPU builds always carry CUDA code: one without any is a CPU build
EXPECT_CUDA = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "vllm",
        "sglang-kernel",
        "sgl-kernel",
        "flash-attn",
        "xformers",
        "flashinfer-jit-cache",
    }
)
# A distribution's status per GPU that is no problem: runs (from SASS, by PTX JIT, by the
# library's nvJitLink), or cannot be told from the headers (said in a note, never a failure)
OK_STATUSES = ("ok", "jit", "lto", "unknown")
CANDIDATE = re.compile(r"(\.so(\.\d+)*|\.cubin|\.fatbin)$")
_SITE_SCRIPT = "import json, sysconfig; p = sysconfig.get_paths(); print(json.dumps([p['purelib'], p['platlib']]))"


def cache_dir() -> Path:
    from sm120patch.probes.verdict_cache import default_cache_dir

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
        key = sha256_text(str(site))[:24]
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


_CODE = re.compile(r"(sass|ptx|lto|kind\d+):sm_\d+[af]?(:\d+\.\d+)?")
_RESULT_TEXT = ("kind", "error", "note", "data", "skipped")
_GOOD_CODES: set[str] = set()  # code names already checked (a warm census sees few distinct ones)


def _good_code(c: Any) -> bool:
    if type(c) is str and _CODE.fullmatch(c):
        _GOOD_CODES.add(c)
        return True
    return False


_RESULT_KEYS = frozenset({*_RESULT_TEXT, "compressed", "groups", "empty_units", "nvjitlink"})


def _valid(hit: Any) -> bool:
    """A cache entry this version would have written, down to each code name (anything else is
    dropped and the file read again, never trusted: a hand-edited or corrupt cache). Tight, as a
    warm census runs it once per file."""
    if type(hit) is not list or len(hit) != 4:
        return False
    size, mtime, ino, res = hit
    if type(size) is not int or type(mtime) is not int or type(ino) is not int or type(res) is not dict:
        return False
    if res.keys() != _RESULT_KEYS or type(res["compressed"]) is not bool or type(res["empty_units"]) is not int:
        return False
    if res["nvjitlink"] not in (True, False, None):
        return False
    for k in _RESULT_TEXT:
        if type(res[k]) is not str:
            return False
    groups = res["groups"]
    if type(groups) is not list:
        return False
    for g in groups:
        if type(g) is not list or len(g) != 2:
            return False
        codes, n = g
        if type(codes) is not list or not codes or type(n) is not int or n <= 0:
            return False
        for c in codes:
            if type(c) is not str or (c not in _GOOD_CODES and not _good_code(c)):
                return False
    return True


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


def record_files(record: Path, outside: list[str] | None = None) -> list[str]:
    """The candidate files a RECORD lists, relative to its site-packages. Entries that leave the
    site (absolute, or `..` after normalising) are not read: a census of one site reads that
    site (they go to `outside`, for a note)."""
    out: list[str] = []
    try:
        if not record.is_file():
            return out
        text = record.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        rel = line.rsplit(",", 2)[0] if line.count(",") >= 2 else line
        rel = rel.strip().strip('"')
        if not CANDIDATE.search(rel):
            continue
        norm = posixpath.normpath(rel.replace("\\", "/"))
        if norm.startswith("/") or norm == ".." or norm.startswith("../") or re.match(r"[A-Za-z]:", norm):
            if outside is not None:
                outside.append(rel)
            continue
        out.append(norm)
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
        if (
            isinstance(hit, list)
            and len(hit) == 5
            and hit[:3] == stamp
            and all(isinstance(x, list) and all(isinstance(f, str) for f in x) for x in hit[3:])
        ):
            files, outside = hit[3], hit[4]
        else:
            outside = []
            files = record_files(record, outside)
            cache.records[info] = [*stamp, files, outside]
            cache.dirty = True
        files = [f for f in files if _inside(f)]  # a cache entry is checked like a RECORD line
        if outside:
            shown = ", ".join(outside[:3]) + (f" and {len(outside) - 3} more" if len(outside) > 3 else "")
            notes.append(f"{info}: RECORD lists {len(outside)} files outside {site} ({shown}): not read")
        dists.append(Dist(name, version, info, files))
    return dists, notes


def _inside(rel: str) -> bool:
    norm = posixpath.normpath(rel)
    return rel == norm and not (norm.startswith(("/", "../")) or norm == "..")


def _read(path: Path) -> dict[str, Any]:
    """One file's code, compactly: identical translation units grouped with a count."""
    from sm120patch.probes.environment.elf import read_file_code

    code = read_file_code(path)
    units: dict[int, list[str]] = {}
    holds_kernels: set[int] = set()
    for e in code.entries:
        units.setdefault(e.container, []).append(e.code)
        if e.kernels != 0:
            holds_kernels.add(e.container)
    # a unit whose every entry is a cubin without kernels (nvcc's device-link unit) holds nothing a
    # call could need: left out (counted), not judged
    empty = set(units) - holds_kernels
    units = {c: codes for c, codes in units.items() if c in holds_kernels}
    groups: dict[tuple[str, ...], int] = {}
    for codes in units.values():
        sig = tuple(sorted(set(codes)))
        groups[sig] = groups.get(sig, 0) + 1
    return {
        "kind": code.kind,
        "groups": [[list(sig), n] for sig, n in sorted(groups.items())],
        "compressed": any(e.compressed for e in code.entries),
        "error": code.error,
        "note": code.note,
        "data": code.data_section,
        "skipped": code.skipped,
        "empty_units": len(empty),
        "nvjitlink": code.nvjitlink if code.kind == "so" else None,
    }


class _Progress:
    """Says how far a cold census has got, on stderr, once it has run PROGRESS_AFTER_S; and,
    from a watcher thread, which file it is on when one file alone takes that long (a slow
    disk, a network mount), so a census never sits silent."""

    def __init__(self, total: int, stream: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.clock, self.stream = total, clock, stream if stream is not None else sys.stderr
        self.start = self.last = clock()
        self.shown = False
        self._lock = threading.Lock()
        self._current: tuple[str, float] | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def _say(self, line: str) -> None:
        with self._lock:
            self.last, self.shown = self.clock(), True
            print(line, file=self.stream, flush=True)

    def tick(self, done: int, what: str) -> None:
        now = self.clock()
        if now - self.start >= PROGRESS_AFTER_S and now - self.last >= 1.0:
            self._say(f"census: {done}/{self.total} files checked ({what})")

    def reading(self, rel: str | None) -> None:
        """`rel` is being read now (None: done with it)."""
        self._current = (rel, self.clock()) if rel is not None else None
        if rel is not None and self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="census-progress", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            cur, now = self._current, self.clock()
            if cur is not None and now - cur[1] >= PROGRESS_AFTER_S and now - self.last >= 1.0:
                self._say(f"census: still reading {cur[0]} ({now - cur[1]:.0f} s)")

    def finish(self, read: int) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=1.0)
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
    try:
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
                    prog.reading(rel)
                    try:
                        res, read = _read(Path(p)), read + 1
                    finally:
                        prog.reading(None)
                    cache.dirty = True
                    prog.tick(done, d.name)
                seen[rel] = [*stamp, res]
                if res["groups"] or res["error"] or res["skipped"]:
                    modules.append({"path": rel, **res})
            if modules:
                out.append({"name": d.name, "version": d.version, "modules": modules})
            elif d.name in EXPECT_CUDA and d.files:
                notes.append(
                    f"{d.name} {d.version} has no CUDA code in its {len(d.files)} shared objects (a CPU build): "
                    f"every CUDA op it has fails on any GPU; install its CUDA build"
                )
    finally:
        prog.finish(read)
    if set(seen) != set(cache.files):
        cache.dirty = True  # files gone since the last census leave the cache with them
    cache.files = seen
    cache.save(site)
    return {
        "site": str(site),
        "distributions": out,
        "notes": notes,
        "files_read": read,
        "files_cached": cached,
        "dist_versions": {d.name: d.version for d in dists},
        "elapsed_s": round(time.monotonic() - t0, 3),
    }


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
    from sm120patch.census.ptxas import ptxas_targets, triton_ptxas
    from sm120patch.census.verdicts import judge_site

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
            "note": g["note"],
        }
        for r in rows
        for a, g in r["gpus"].items()
        if g["status"] not in OK_STATUSES
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


# Packages a server loads at start: one that cannot run on its GPU fails every start (preflight's exit)
SERVER_PACKAGES = frozenset({"torch", "sgl-kernel", "sglang-kernel", "flashinfer-python", "flashinfer-jit-cache"})
# Packages whose missing images are by design: FlashInfer picks these cubins by the GPU they name
EXPECTED_MISSING = frozenset({"flashinfer-cubin"})


def failing(report: dict[str, Any], only: frozenset[str] | None = None) -> list[dict[str, Any]]:
    """The census problems that fail a run: a distribution that cannot run (NO, SOME, partial) on a
    GPU it was judged for, among `only` (default: every distribution but EXPECTED_MISSING)."""
    return [
        p
        for p in report["problems"]
        if (p["package"] in only if only is not None else p["package"] not in EXPECTED_MISSING)
    ]


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
    from sm120patch.probes.environment.device import archs_present

    gpus = archs_present(machine) or list(archs)
    return census(sites_for(given, python, package_dirs), gpus, machine.driver)
