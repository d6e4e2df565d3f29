"""The kernel catalogue (patches/kernels.toml) against FlashInfer's own spec, read from real releases.

The oracle is each release's own source, read here with ast, never the catalogue read back: the
generator a kernel names is a function of the file it names (in the newest release); a kernel the
catalogue says is absent on an arch has a generator whose `supported_major_versions` leaves that
arch's major out (or, for gate = "symbol", names its arch in the generator); and the facts the
recipes stand on hold: gen_trtllm_comm_module passes [9, 10] up to 0.6.16 and a list holding 12
from 0.6.17; gen_cutlass_fused_moe_sm120_module passes [12].
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sm120patch.catalogue.kernels import load_kernels
from tests.conftest import pristine_or_skip

pytestmark = pytest.mark.releases

NEWEST = "0.7.4"


def generator(root: Path, file: str, name: str) -> ast.FunctionDef | None:
    path = root / "flashinfer" / file
    if not path.is_file():
        return None
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def majors(fn: ast.FunctionDef) -> list[int] | None:
    """The literal `supported_major_versions=[...]` the generator passes, or None where it passes none."""
    for kw in (n for n in ast.walk(fn) if isinstance(n, ast.keyword)):
        if kw.arg == "supported_major_versions":
            try:
                return list(ast.literal_eval(kw.value))
            except ValueError:
                return None
    return None


@pytest.fixture(scope="module")
def kernels():
    return load_kernels()


def test_every_generator_named_is_in_the_file_named(kernels) -> None:
    root = pristine_or_skip("flashinfer", NEWEST)
    missing = [k.id for k in kernels.values() if k.package == "flashinfer" and not generator(root, k.file, k.generator)]
    assert len(kernels) >= 10 and missing == [], missing


@pytest.mark.parametrize("version", ["0.6.1", NEWEST])
def test_absent_on_is_what_the_generator_builds(kernels, version: str) -> None:
    root = pristine_or_skip("flashinfer", version)
    checked = 0
    for k in kernels.values():
        fn = generator(root, k.file, k.generator)
        if fn is None or not k.must_be_absent_on:
            continue
        found = majors(fn)
        if found is not None:
            assert not {a.major for a in k.must_be_absent_on} & set(found), (k.id, found)
        else:  # an arch-named generator (gen_..._sm90_module): its name says what it builds
            assert not any(f"sm{a.major}" in k.generator for a in k.must_be_absent_on), k.id
        checked += 1
    assert checked >= 2


@pytest.mark.parametrize(("version", "has_12"), [("0.6.1", False), ("0.6.16", False), ("0.6.17", True), (NEWEST, True)])
def test_trtllm_comm_majors_are_the_release_s(kernels, version: str, has_12: bool) -> None:
    k = kernels["flashinfer:trtllm_comm"]
    fn = generator(pristine_or_skip("flashinfer", version), k.file, k.generator)
    assert fn is not None
    found = majors(fn)
    assert found is not None and {9, 10} <= set(found) and (12 in found) is has_12, found


@pytest.mark.parametrize("version", ["0.6.1", NEWEST])
def test_the_sm120_fused_moe_is_built_for_major_12_only(kernels, version: str) -> None:
    k = kernels["flashinfer:cutlass_fused_moe_sm120"]
    fn = generator(pristine_or_skip("flashinfer", version), k.file, k.generator)
    assert fn is not None and majors(fn) == [12]
