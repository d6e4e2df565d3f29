"""The kernel catalogue (patches/kernels.toml): what a recipe's `needs` ids mean to a probe.

Kept as data so that adding a kernel, or learning that one moved to another generator,
is a reviewed one-line change rather than code. Validation is strict like catalogue/recipes.py:
an unknown key or a wrong type is a one-line error naming the file and the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sm120patch.arch import Arch, parse_arch
from sm120patch.catalogue.datafile import check_table, fail, read_toml, str_list
from sm120patch.errors import RecipeError, UserError

# the run rung's numeric checks (sm120patch/probes/run/rung.py: CHECKS), or "" for none
RUN_CHECKS = ("", "rmsnorm", "allreduce_fusion", "fused_moe", "pcie_ipc_allreduce")
# how the static rung reads the generator: its supported_major_versions (majors), a generator
# FlashInfer deliberately builds for every arch (none), or only that the function exists (symbol)
GATES = ("majors", "none", "symbol")

_KEYS: dict[str, type] = {
    "title": str,
    "why": str,
    "file": str,
    "generator": str,
    "generator_kwargs": dict,
    "jit_modules": list,
    "cubin_globs": list,
    "must_be_absent_on": list,
    "run": str,
    "run_unavailable": str,
    "gate": str,
    "source_checks": list,
}
_REQUIRED = ("title", "why", "file", "generator")
_CHECK_KEYS: dict[str, type] = {
    "file": str,
    "requires": str,
    "forbids": str,
    "archs": list,
    "finding": str,
    "fix": str,
}
_CHECK_OPTIONAL = ("forbids",)


@dataclass(frozen=True)
class SourceCheck:
    """A fact of host code no cubin shows (a launch configuration the arch cannot run), read
    from FlashInfer's source: where the arch is in `archs`, `requires` (a regex) must match
    `file` and `forbids` (a regex, optional) must not (the fixed value the fix replaced)."""

    file: str  # relative to the flashinfer/ package, e.g. "data/include/flashinfer/comm/x.cuh"
    requires: str
    archs: tuple[Arch, ...]
    finding: str  # what it means when the regex does not match
    fix: str  # the upstream fix that makes it match
    forbids: str = ""


@dataclass(frozen=True)
class Kernel:
    id: str  # "flashinfer:trtllm_comm"
    title: str
    why: str
    file: str  # relative to the flashinfer/ package, e.g. "jit/comm.py"
    generator: str
    generator_kwargs: tuple[tuple[str, Any], ...] = ()
    jit_modules: tuple[str, ...] = ()
    cubin_globs: tuple[str, ...] = ()
    must_be_absent_on: tuple[Arch, ...] = ()
    run: str = ""
    run_unavailable: str = ""
    gate: str = "majors"
    source_checks: tuple[SourceCheck, ...] = ()

    @property
    def package(self) -> str:
        return self.id.split(":", 1)[0]

    @property
    def module(self) -> str:
        """Dotted module of the generator: "jit/comm.py" -> "flashinfer.jit.comm"."""
        return ".".join((self.package, *PurePosixPath(self.file).with_suffix("").parts))

    def absent_on(self, arch: Arch) -> bool:
        return arch in self.must_be_absent_on


def default_catalogue() -> Path:
    from sm120patch.catalogue.recipes import default_recipe_dir  # late: keep imports one-way

    return default_recipe_dir() / "kernels.toml"


def _load_kernel(path: Path, kid: str, raw: Any) -> Kernel:
    if not isinstance(raw, dict):
        raise fail(path, kid, "is not a table", f'write it as ["{kid}"]')
    if ":" not in kid or not all(kid.split(":", 1)):
        raise fail(path, kid, "id is not package:name", 'name it like "flashinfer:trtllm_comm"')
    check_table(path, kid, raw, _KEYS)
    for k in _REQUIRED:
        if k not in raw:
            raise fail(path, f"{kid}.{k}", "is missing", "add it")
    file = PurePosixPath(raw["file"])
    if file.is_absolute() or ".." in file.parts or file.suffix != ".py":
        raise fail(
            path, f"{kid}.file", f"{raw['file']!r} is not a .py path inside the package", 'give e.g. "jit/comm.py"'
        )
    if not raw["generator"].isidentifier():
        raise fail(path, f"{kid}.generator", "is not a Python identifier", "give a function name")
    run = raw.get("run", "")
    if run not in RUN_CHECKS:
        raise fail(path, f"{kid}.run", f"unknown check {run!r}", f"use one of {', '.join(repr(c) for c in RUN_CHECKS)}")
    absent = _archs(path, f"{kid}.must_be_absent_on", raw.get("must_be_absent_on", []))
    gate = raw.get("gate", "majors")
    if gate not in GATES:
        raise fail(path, f"{kid}.gate", f"unknown gate {gate!r}", f"use one of {', '.join(GATES)}")
    checks = tuple(
        _source_check(path, f"{kid}.source_checks[{i}]", c) for i, c in enumerate(raw.get("source_checks", []))
    )
    return Kernel(
        id=kid,
        title=raw["title"],
        why=raw["why"],
        file=str(file),
        generator=raw["generator"],
        generator_kwargs=tuple(sorted(raw.get("generator_kwargs", {}).items())),
        jit_modules=str_list(path, f"{kid}.jit_modules", raw.get("jit_modules", [])),
        cubin_globs=str_list(path, f"{kid}.cubin_globs", raw.get("cubin_globs", [])),
        must_be_absent_on=absent,
        run=run,
        run_unavailable=raw.get("run_unavailable", ""),
        gate=gate,
        source_checks=checks,
    )


def _archs(path: Path, key: str, values: list[Any]) -> tuple[Arch, ...]:
    out = []
    for i, a in enumerate(str_list(path, key, values)):
        try:
            out.append(parse_arch(a))
        except UserError as e:
            raise fail(path, f"{key}[{i}]", str(e), "use sm_120 style") from e
    return tuple(out)


def _source_check(path: Path, key: str, raw: Any) -> SourceCheck:
    if not isinstance(raw, dict):
        raise fail(path, key, "is not a table", "write it as an inline table {file = ..., requires = ...}")
    check_table(path, key, raw, _CHECK_KEYS)
    for k in _CHECK_KEYS:
        if k not in raw and k not in _CHECK_OPTIONAL:
            raise fail(path, f"{key}.{k}", "is missing", f"give {', '.join(_CHECK_KEYS)}")
    file = PurePosixPath(raw["file"])
    if file.is_absolute() or ".." in file.parts:
        raise fail(path, f"{key}.file", f"{raw['file']!r} leaves the package", "give a path inside flashinfer/")
    for k in ("requires", "forbids"):
        try:
            re.compile(raw.get(k, ""))
        except re.error as e:
            raise fail(path, f"{key}.{k}", f"not a regular expression ({e})", "fix the pattern") from None
    archs = _archs(path, f"{key}.archs", raw["archs"])
    return SourceCheck(str(file), raw["requires"], archs, raw["finding"], raw["fix"], raw.get("forbids", ""))


def load_kernels(path: Path | None = None) -> dict[str, Kernel]:
    """Every kernel in the catalogue, by id (read with the same strict loader as recipes)."""
    path = path or default_catalogue()
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise RecipeError(f"{path}: cannot read the kernel catalogue ({e.strerror}); reinstall sm120patch") from None
    data = read_toml(path, blob, "the kernel catalogue")
    return {kid: _load_kernel(path, kid, raw) for kid, raw in data.items()}


def get_kernel(kernel_id: str, catalogue: dict[str, Kernel] | None = None) -> Kernel:
    kernels = catalogue if catalogue is not None else load_kernels()
    if kernel_id not in kernels:
        raise UserError(f"needs: unknown kernel {kernel_id!r}; known: {', '.join(sorted(kernels))}")
    return kernels[kernel_id]
