"""Per module and per distribution, can a GPU run what the census found, and what to do if not.

Each module's translation units (fatbin containers) are judged with the loader's rules
(census/rules.py); the fix comes from fixes.py. Modules built alike (flashinfer-cubin's
thousands of cubins of a few kinds) are judged once (memoised on their image sets).
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sm120patch.arch import Arch
from sm120patch.census.rules import Code, Verdict, judge, sort_names


@functools.lru_cache(maxsize=4096)
def _code(text: str) -> Code:
    return Code.parse(text)


def _codes(sig: Iterable[str]) -> list[Code]:
    return [_code(c) for c in sig]


def module_verdict(
    module: dict[str, Any],
    gpu: Arch,
    driver: str | None,
    nvjitlink: tuple[int | None, str, bool | None] | None = None,
) -> dict[str, Any]:
    """See `_verdict`; modules built alike (thousands of cubins of a few kinds) are judged once."""
    key = tuple((tuple(sig), n) for sig, n in module["groups"])
    return dict(_verdict(key, gpu, driver, nvjitlink, str(module.get("data") or "")))


def other_arch_only(codes: Sequence[Code], main_rest: frozenset[str], widest: int) -> bool:
    """A translation unit that cannot run on the GPU: built only for other architectures (kernels
    the library keeps for the GPUs they were written for and picks by the GPU it runs on:
    cuSPARSE 12.6's sm_80-only units, cuBLAS 13.1's sm_100-only and sm_89 + sm_120f units), or
    built from the module's own arch list with the GPU left out (a build slip: a call needs it)?

    `main_rest` is what the module's main list (the widest unit that runs on the GPU)
    carries besides the GPU's own images; a unit that holds all of it (and two targets or
    more) is that list minus the GPU: missing. So is a unit as wide as the module's widest
    (`widest` targets): the module's general list, which lacks the GPU. Anything narrower is
    other architectures' code."""
    names = {c.name for c in codes}
    if len(names) < 2:
        return True
    return not ((main_rest and main_rest <= names) or len(names) >= widest)


@functools.lru_cache(maxsize=4096)
def _verdict(
    groups_key: tuple[tuple[tuple[str, ...], int], ...],
    gpu: Arch,
    driver: str | None,
    nvjitlink: tuple[int | None, str, bool | None] | None = None,
    data: str = "",
) -> dict[str, Any]:
    """Whether a module's code runs on `gpu`: `ok`, `partial` (some translation units have no
    image and the evidence says they hold code a call on `gpu` needs), `none`, or `unknown`
    (the headers cannot tell).

    nvcc's device-link unit never holds PTX (seen with nvcc 13.0 in the tests), so where the
    module runs only by JIT, units without PTX are not counted as missing. Units built only for
    other architectures (`other_arch_only`) are not missing either: the module is `ok`, with a
    note. A module none of whose fatbin code fits but which keeps a large data section (`data`,
    elf.BIG_DATA) may load its kernels from there itself: `unknown`, not `none`."""
    groups = [(_codes(sig), n) for sig, n in groups_key]
    whole: Verdict = judge([c for codes, _ in groups for c in codes], gpu, driver, nvjitlink)
    units = sum(n for _, n in groups)
    judged = [(codes, n, judge(codes, gpu, driver, nvjitlink)) for codes, n in groups]
    running = [(codes, n) for codes, n, v in judged if v.ok]
    main = max(running, key=lambda t: (len(t[0]), t[1]))[0] if running else []
    main_rest = frozenset(c.name for c in main if not judge([c], gpu, driver, nvjitlink).ok)
    widest = max((len({c.name for c in codes}) for codes, _ in groups), default=0)
    missing, first_missing, other, others = 0, None, 0, set()
    for codes, n, v in judged:
        if v.ok or (whole.how == "jit" and not any(c.kind == "ptx" for c in codes)):
            continue
        if whole.ok and other_arch_only(codes, main_rest, widest):
            other += n
            others.update(c.name for c in codes)
            continue
        missing += n
        first_missing = first_missing or v
    status = "none" if not whole.ok else "partial" if missing else "unknown" if whole.how == "unknown" else "ok"
    why, error, note = whole.why, whole.error, ""
    if status == "partial" and first_missing is not None:
        why, error = f"{missing} of {units} translation units: {first_missing.why}", first_missing.error
    if status == "none" and data:
        carried = ", ".join(sort_names({c.name for codes, _ in groups for c in codes}))
        status, error = "unknown", ""
        why = (
            f"cannot tell from the headers: its .nv_fatbin holds no image for this GPU (only {carried}), but it "
            f"keeps {data} of data the census does not read, where a library may hold kernels it loads "
            "itself (cuFFT 12 keeps its kernels and their LTO IR there)"
        )
    if other:
        note = (
            f"{other} of {units} translation units hold only other architectures' code "
            f"({', '.join(sort_names(others)[:6])}{', ...' if len(others) > 6 else ''}): kernels the library "
            f"picks on those GPUs, never launched on {gpu.name}"
        )
    return {
        "status": status,
        "how": whole.how if status != "unknown" else "unknown",
        "image": whole.image,
        "units": units,
        "missing_units": missing,
        "other_arch_units": other,
        "error": error,
        "why": why,
        "note": note,
    }


def _all_codes(modules: Sequence[dict[str, Any]]) -> list[Code]:
    return _codes({c for m in modules for sig, _ in m["groups"] for c in sig})


def _images(modules: Sequence[dict[str, Any]], kind: str) -> list[str]:
    return sort_names({c.name for c in _all_codes(modules) if c.kind == kind})


def _ptx_isas(modules: Sequence[dict[str, Any]]) -> list[str]:
    isas = {c.isa for c in _all_codes(modules) if c.kind == "ptx" and c.isa}
    return sorted(isas, key=lambda s: tuple(int(x) for x in s.split(".")))


_NVJITLINK = ("nvidia-nvjitlink", "nvidia-nvjitlink-cu12", "nvidia-nvjitlink-cu11")


_CUDA_FOLDER = re.compile(r"(?:^|/)cu(\d\d)(?:/|$)")


def nvjitlink_for(module: dict[str, Any], have: str) -> tuple[int | None, str, bool | None] | None:
    """What LTO IR in `module` needs: the CUDA major of its NVIDIA wheel (its `nvidia/cuNN/`
    folder), the nvidia-nvjitlink version installed (`have`, "" if none), and whether the module
    uses nvJitLink (None for a loose fatbin: whoever loads it may). None: the module has no LTO IR."""
    if not any(c.startswith("lto:") for sig, _ in module["groups"] for c in sig):
        return None
    m = _CUDA_FOLDER.search(module["path"])
    return (int(m.group(1)) if m else None), have, module.get("nvjitlink")


def judge_site(scan: dict[str, Any], archs: Sequence[Arch], driver: str | None) -> list[dict[str, Any]]:
    """Per distribution: the images it carries and, per GPU, what runs and the fix for what does not."""
    from sm120patch.census.fixes import fix_for, note_for

    versions = scan.get("dist_versions") or {}
    have = next((versions[n] for n in _NVJITLINK if versions.get(n)), "")
    rows = []
    for d in scan["distributions"]:
        mods = d["modules"]
        links = {m["path"]: nvjitlink_for(m, have) for m in mods}
        per_gpu: dict[str, Any] = {}
        for a in archs:
            verdicts = {
                m["path"]: module_verdict(m, a, driver, links[m["path"]])
                for m in mods
                if m["groups"]  # a module with no fatbin code is no CUDA module, whatever data it keeps
            }
            by: dict[str, list[str]] = {"none": [], "partial": [], "unknown": [], "jit": [], "lto": [], "note": []}
            for p, v in verdicts.items():  # one pass: flashinfer-cubin has thousands of modules
                st = v["status"]
                if st in ("none", "partial", "unknown"):
                    by[st].append(p)
                if st != "none" and v["how"] in ("jit", "lto"):
                    by[v["how"]].append(p)
                if v["note"]:
                    by["note"].append(p)
            none, partial, unknown, jit, lto = (sorted(by[k]) for k in ("none", "partial", "unknown", "jit", "lto"))
            status = (
                "none"
                if none and len(none) == len(verdicts)
                else "some"
                if none
                else "partial"
                if partial
                else "unknown"
                if unknown
                else "ok"
            )
            if status == "ok" and jit:
                status = "jit"  # runs, but only after the driver JIT-compiles PTX at first load
            elif status == "ok" and lto:
                status = "lto"  # runs once the library links its LTO IR through nvJitLink
            errors = sorted({verdicts[p]["error"] for p in none + partial if verdicts[p]["error"]})
            per_gpu[a.name] = {
                "status": status,
                "cannot_run": none,
                "partial": partial,
                "unknown": unknown,
                "jit": jit,
                "lto": lto,
                "modules": verdicts,
                "you_will_see": [
                    f"CUDA error: {e}" if e.startswith("no kernel") or e.startswith("the provided") else e
                    for e in errors
                ],
                "fix": fix_for(d["name"], d["version"], a, _images(mods, "sass")) if none or partial else "",
                "note": note_for(d["name"], a) if none or partial else "",
                "notes": [f"{p}: {verdicts[p]['note']}" for p in sorted(by["note"])]
                + [f"{p}: {verdicts[p]['why']}" for p in unknown],
            }
        rows.append(
            {
                "name": d["name"],
                "version": d["version"],
                "modules": [m["path"] for m in mods],
                "unreadable": [
                    {"path": m["path"], "error": m["error"] or m.get("skipped", "")}
                    for m in mods
                    if m["error"] or m.get("skipped")
                ],
                "cut_short": [{"path": m["path"], "note": m["note"]} for m in mods if m.get("note")],
                "sass": _images(mods, "sass"),
                "ptx": _images(mods, "ptx"),
                "lto": _images(mods, "lto"),
                "ptx_isa": _ptx_isas(mods),
                "gpus": per_gpu,
            }
        )
    return rows


def recipe_notes(report: dict[str, Any], needs: dict[str, Sequence[str]]) -> dict[str, list[str]]:
    """Per recipe id: where a kernel it needs lives in a censused module that cannot run on a GPU
    (the kernel catalogue's `jit_modules`, a module `<m>.so` or folder `<m>/`, and `cubin_globs`,
    under a `cubins/` folder), one line each, naming the package, the module and the fix."""
    from sm120patch.catalogue.kernels import load_kernels
    from sm120patch.errors import UserError

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
