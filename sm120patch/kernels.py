"""The kernel catalogue (patches/kernels.toml): what a recipe's `needs` ids mean to a probe.

Kept as data so that adding a kernel, or learning that one moved to another generator,
is a reviewed one-line change rather than code. Validation is strict like recipes.py:
an unknown key or a wrong type is a one-line error naming the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sm120patch.arch import Arch, parse_arch
from sm120patch.datafile import check_table, fail, read_toml, str_list
from sm120patch.errors import RecipeError, UserError

RUN_CHECKS = ("", "rmsnorm")

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
}
_REQUIRED = ("title", "why", "file", "generator")


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
    from sm120patch.recipes import default_recipe_dir  # late: keep imports one-way

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
    absent: list[Arch] = []
    for i, a in enumerate(str_list(path, f"{kid}.must_be_absent_on", raw.get("must_be_absent_on", []))):
        try:
            absent.append(parse_arch(a))
        except UserError as e:
            raise fail(path, f"{kid}.must_be_absent_on[{i}]", str(e), "use sm_120 style") from e
    return Kernel(
        id=kid,
        title=raw["title"],
        why=raw["why"],
        file=str(file),
        generator=raw["generator"],
        generator_kwargs=tuple(sorted(raw.get("generator_kwargs", {}).items())),
        jit_modules=str_list(path, f"{kid}.jit_modules", raw.get("jit_modules", [])),
        cubin_globs=str_list(path, f"{kid}.cubin_globs", raw.get("cubin_globs", [])),
        must_be_absent_on=tuple(absent),
        run=run,
        run_unavailable=raw.get("run_unavailable", ""),
    )


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
