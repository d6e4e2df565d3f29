"""The releases that fixed a toolchain for an SM12x arch (patches/fixed_versions.toml) are named in the advice for
a crash that shows that tool lacking that arch, each with its source; the table holds facts with their URLs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from sm120patch.errors import RecipeError
from sm120patch.triage.versions import library_rows, load, rows_for
from tests.unit.cli_entry import SM120PATCH

TRITON_121 = (
    "Traceback (most recent call last):\n"
    "RuntimeError: Internal Triton PTX codegen error\n"
    "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'\n"
)
NVCC_120 = "nvcc fatal   : Unsupported gpu architecture 'compute_120'\n"


def test_every_row_has_its_source() -> None:
    rows = load()
    assert rows and all(r.source.startswith("https://") and r.fact and r.archs for r in rows)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (TRITON_121, {("triton", "3.6.0"), ("triton", "TRITON_PTXAS_PATH")}),
        (NVCC_120, {("cuda", "12.8")}),
        ("RuntimeError: 'sm_120' is not a recognized processor for this target (triton)", {("triton", "3.3.0")}),
        ("ptxas fatal   : Value 'sm_90a' is not defined for option 'gpu-name'", set()),  # not an SM12x arch row
    ],
)
def test_rows_for_the_tool_and_arch_the_log_names(text: str, want: set[tuple[str, str]]) -> None:
    assert {(r.component, r.version) for r in rows_for(text, load())} == want


def test_diagnose_names_the_release_and_its_source(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(TRITON_121, encoding="utf-8")
    res = CliRunner().invoke(SM120PATCH, ["diagnose", "--json", str(log)])
    assert res.exit_code in (0, 1), res.output
    [cause] = [f for f in json.loads(res.stdout)["findings"] if f["fatal"] and f["class"] == "toolchain-lacks-arch"]
    notes = " ".join(cause["notes"])
    assert "triton 3.6.0" in notes and "https://github.com/triton-lang/triton/issues/10331" in notes
    assert "TRITON_PTXAS_PATH" in notes


def test_a_row_without_a_source_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "fixed_versions.toml"
    bad.write_text('[[fix]]\ncomponent = "cuda"\narchs = ["sm_120"]\nversion = "12.8"\nfact = "x"\nsource = "a blog"\n')
    with pytest.raises(RecipeError, match="https URL"):
        load(bad)


@pytest.mark.parametrize(
    ("majors", "signature", "cls"),
    [
        ("[12]", "flashinfer-jit-major-12-without-arch", "toolchain-lacks-arch"),
        ("[9, 10, 12]", "flashinfer-jit-major-12-without-arch", "toolchain-lacks-arch"),
        ("[9, 10]", "flashinfer-jit-arch-excluded", "arch-path-unsupported"),
        ("[10, 11]", "flashinfer-jit-arch-excluded", "arch-path-unsupported"),
    ],
)
def test_a_flashinfer_module_that_lists_major_12_and_still_finds_no_arch_is_the_toolchain(
    tmp_path: Path, majors: str, signature: str, cls: str
) -> None:
    """Major 12 in the module's list: the GPU's major was allowed, the arch list FlashInfer built from held none
    (an nvcc older than it asks for SM12x); without 12 the module lacks the major, as before."""
    log = tmp_path / "server.log"
    log.write_text(
        "  File \"/v/flashinfer/jit/fused_moe.py\", line 70, in gen_cutlass_fused_moe_sm120_module\n"
        f"RuntimeError: No supported CUDA architectures found for major versions {majors}.\n",
        encoding="utf-8",
    )
    res = CliRunner().invoke(SM120PATCH, ["diagnose", "--json", str(log)])
    [cause] = [f for f in json.loads(res.stdout)["findings"] if f["fatal"]]
    assert (cause["signature"], cause["class"]) == (signature, cls)
    if cls == "toolchain-lacks-arch":
        assert "CUDA 12.9" in cause["next_step"] and "FLASHINFER_CUDA_ARCH_LIST" in cause["next_step"]


# ---- library rows: the first release whose build carries the arch, held to what the real wheels carry

RECORD = Path(__file__).resolve().parents[1] / "data" / "versions" / "wheels.json"
_SASS = re.compile(r"^sm_(?P<major>\d+?)(?P<minor>\d)(?P<suffix>[af]?)$")


def _runs_on(sass: str, arch: str) -> bool:
    """The CUDA guide's rules (docs.nvidia.com/cuda/cuda-c-programming-guide, "Binary Compatibility" and the
    arch-specific / family-specific features): plain sm_XY runs on X.z for z >= Y, sm_XYf on its family (same
    major, minor >= Y), sm_XYa on X.Y only. Written here from the guide, not imported from the census."""
    s, g = _SASS.match(sass), _SASS.match(arch)
    assert s and g, (sass, arch)
    if s["suffix"] == "a":
        return (s["major"], s["minor"]) == (g["major"], g["minor"])
    return s["major"] == g["major"] and int(g["minor"]) >= int(s["minor"])


def _recorded(dist: str, version: str, platform: str) -> dict:
    wheels = json.loads(RECORD.read_text())["wheels"]
    hit = [w for w in wheels if (w["dist"], w["version"], w["platform"]) == (dist, version, platform)]
    assert hit, f"{dist} {version} ({platform}) is not in {RECORD.name}: run tools/calibrate_versions.py --only {dist}"
    return hit[0]


LIBRARY_ROWS = [r for r in load() if not r.toolchain]


def test_the_table_has_library_rows_and_most_are_held_to_real_wheels() -> None:
    assert len(LIBRARY_ROWS) >= 8
    assert sum(bool(r.wheel) for r in LIBRARY_ROWS) >= 6


@pytest.mark.parametrize("row", [r for r in LIBRARY_ROWS if r.wheel], ids=lambda r: r.component)
def test_a_library_row_is_what_its_wheels_carry(row) -> None:
    """The row's version carries SASS that runs on each of its archs; the release before carries none for the
    first of them (so 'first' is true at least against the release before)."""
    new = _recorded(row.wheel, row.version, row.platform)
    old = _recorded(row.wheel, row.before, row.platform)
    for arch in row.archs:
        assert any(_runs_on(s, arch) for s in new["sass_sm12x"]), (row.component, row.version, arch, new["sass_sm12x"])
    assert not any(_runs_on(s, row.archs[0]) for s in old["sass_sm12x"]), (row.component, row.before, old)


def test_the_record_names_the_wheels_it_read() -> None:
    for w in json.loads(RECORD.read_text())["wheels"]:
        assert w["file"].endswith(".whl") and len(w["sha256"]) == 64
        assert w["file"].lower().startswith(w["dist"].lower().replace("-", "_") + "-" + w["version"])


def test_vllm_s_first_sm120_wheels_pin_a_torch_whose_pypi_build_lacks_it() -> None:
    """What the vllm row says of torch, from the record: 0.9.2 pins torch 2.7.0, whose PyPI wheel has no SM12x
    code; torch 2.8.0's has."""
    assert _recorded("vllm", "0.9.2", "manylinux1_x86_64")["requires_torch"] == "torch==2.7.0"
    assert not _recorded("torch", "2.7.0", "manylinux_2_28_x86_64")["sass_sm12x"]
    assert "sm_120" in _recorded("torch", "2.8.0", "manylinux_2_28_x86_64")["sass_sm12x"]


def _diagnose(tmp_path: Path, text: str) -> list[dict]:
    log = tmp_path / "server.log"
    log.write_text(text, encoding="utf-8")
    res = CliRunner().invoke(SM120PATCH, ["diagnose", "--json", str(log)])
    assert res.exit_code in (0, 1), res.output
    return [f for f in json.loads(res.stdout)["findings"] if f["fatal"]]


ORT_5090 = (
    "2025-06-01 10:00:00 [E:onnxruntime:Default, cuda_call.cc:118 CudaCall] CUDA failure 209: no kernel image is "
    "available for execution on the device ; GPU=0 ; hostname=box ; file=/onnxruntime_src/onnxruntime/core/"
    "providers/cuda/cuda_execution_provider.cc ; line=270 ; expr=cudaSetDevice(info_.device_id);\n"
    "NVIDIA GeForce RTX 5090\n"
)


def test_a_binary_without_the_arch_names_the_library_s_first_release_with_it(tmp_path: Path) -> None:
    (cause,) = [f for f in _diagnose(tmp_path, ORT_5090) if f["class"] == "binary-lacks-arch"]
    notes = " ".join(cause["notes"])
    assert "onnxruntime 1.27.0" in notes and "onnxruntime-gpu>=1.27" in notes
    assert "https://github.com/microsoft/onnxruntime/pull/29711" in notes


def test_pytorch_without_the_arch_names_the_first_pypi_wheel_with_it(tmp_path: Path) -> None:
    text = (
        "NVIDIA GeForce RTX 5070 Ti with CUDA capability sm_120 is not compatible with the current PyTorch "
        "installation.\nThe current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 "
        "sm_90.\n"
        "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
    )
    notes = " ".join(n for f in _diagnose(tmp_path, text) for n in f["notes"])
    assert "torch 2.8.0" in notes and "torch>=2.8" in notes and "whl/cu128" in notes


def test_a_library_row_is_not_named_for_another_gpu_or_another_class(tmp_path: Path) -> None:
    """The same onnxruntime failure on an RTX 3090 is not SM12x: no SM12x release is its fix; an out-of-memory
    in onnxruntime is no binary without the arch."""
    other = ORT_5090.replace("NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 3090")
    assert "onnxruntime 1.27.0" not in " ".join(n for f in _diagnose(tmp_path, other) for n in f["notes"])
    oom = (
        "[E:onnxruntime:, sequential_executor.cc:516 ExecuteKernel] Non-zero status code returned while running "
        "Conv node. Status Message: CUDA error cudaErrorMemoryAllocation:out of memory\n"
    )
    assert "onnxruntime 1.27.0" not in " ".join(n for f in _diagnose(tmp_path, oom) for n in f["notes"])


def test_library_rows_pick_the_row_for_the_gpu_the_log_shows() -> None:
    """onnxruntime's row is about sm_120 only (its sm_120a code does not run on 12.1): on a DGX Spark it is not
    named; torch's sm_120 code runs on both."""
    table = load()
    assert [r.component for r in library_rows(["onnxruntime"], "binary-lacks-arch", False, table)] == ["onnxruntime"]
    assert library_rows(["onnxruntime"], "binary-lacks-arch", True, table) == []
    assert [r.version for r in library_rows(["torch"], "binary-lacks-arch", True, table)] == ["2.8.0"]
    assert [r.component for r in library_rows(["vllm._C"], "binary-lacks-arch", False, table)] == ["vllm"]
    assert library_rows(["torch"], "kernel-fault", False, table) == []


def test_a_row_with_a_wheel_needs_the_release_before_it(tmp_path: Path) -> None:
    bad = tmp_path / "fixed_versions.toml"
    bad.write_text(
        '[[fix]]\ncomponent = "x"\narchs = ["sm_120"]\nversion = "1"\nfact = "x"\nsource = "https://a.b"\n'
        'wheel = "x"\n'
    )
    with pytest.raises(RecipeError, match="before"):
        load(bad)
    bad.write_text(
        '[[fix]]\ncomponent = "x"\narchs = ["sm_120"]\nversion = "1"\nfact = "x"\nsource = "https://a.b"\n'
        'classes = ["no-such-class"]\n'
    )
    with pytest.raises(RecipeError, match="no-such-class"):
        load(bad)


def test_onnx_runtime_s_own_node_wording_names_it_when_the_log_does_not(tmp_path: Path) -> None:
    """ONNX Runtime reports a failed node as "Non-zero status code returned while running <Op> node" (the app that
    wraps it may never say "onnxruntime"): that wording names the library, so its first release with the arch is
    named; the same CUDA error without it names no library row."""
    log = (
        "NVIDIA GeForce RTX 5090\n"
        "ERROR Non-zero status code returned while running Cast node.\n"
        "      Name:'/pre_encode/Cast' Status Message: CUDA error cudaErrorNoKernelImageForDevice:no kernel image "
        "is available for execution on the device\n"
    )
    (cause,) = _diagnose(tmp_path, log)
    assert cause["details"].get("library") == "onnxruntime" and "onnxruntime 1.27.0" in " ".join(cause["notes"])
    bare = log.replace("Non-zero status code returned while running Cast node.", "inference step failed")
    assert not [n for f in _diagnose(tmp_path, bare) for n in f["notes"] if "onnxruntime 1.27.0" in n]


# ---- a second reader: NVIDIA's cuobjdump on the same code (tests/data/versions/README.md says what was shown)

CUOBJDUMP = RECORD.parent / "cuobjdump-h100.txt"
_SHOWN = {  # the fatbin cut from each wheel -> (dist, version, platform) of the record
    "bnb-0.45.2-cuda126.fatbin": ("bitsandbytes", "0.45.2", "manylinux_2_24_x86_64"),
    "bnb-0.45.3-cuda128.fatbin": ("bitsandbytes", "0.45.3", "manylinux_2_24_x86_64"),
    "jax-0.5.3-prng.fatbin": ("jax-cuda12-plugin", "0.5.3", "manylinux2014_x86_64"),
    "jax-0.6.0-prng.fatbin": ("jax-cuda12-plugin", "0.6.0", "manylinux2014_x86_64"),
    "ort-1.23.0.head.fatbin": ("onnxruntime-gpu", "1.23.0", None),
    "ort-1.23.2.head.fatbin": ("onnxruntime-gpu", "1.23.2", None),
    "ort-1.27.0.head.fatbin": ("onnxruntime-gpu", "1.27.0", "manylinux_2_28_x86_64"),
}
_LISTED = re.compile(r"^(?P<kind>ELF|PTX) file +\d+: \S+\.(?P<arch>sm_\d+[af]?)\.(?:cubin|ptx)$")


def _cuobjdump() -> dict[str, dict[str, set[str]]]:
    """Per fatbin shown, the archs cuobjdump listed as ELF (SASS) and as PTX."""
    out: dict[str, dict[str, set[str]]] = {}
    current = None
    for line in CUOBJDUMP.read_text().splitlines():
        if line.startswith("== "):
            current = out.setdefault(line[3:], {"ELF": set(), "PTX": set()})
        elif current is not None and (m := _LISTED.match(line)):
            current[m["kind"]].add(m["arch"])
    return out


def test_cuobjdump_agrees_with_the_census_on_the_sm12x_code() -> None:
    """What NVIDIA's reader lists of SM12x code in the files it was shown is what the census recorded for those
    wheels: the new releases' SM12x SASS and PTX, the releases before without any; onnxruntime-gpu 1.23.0's PTX is
    compute_90a only (no PTX a 12.x GPU can compile), 1.23.2's plain compute_90."""
    listed = _cuobjdump()
    assert set(listed) == set(_SHOWN)
    for name, (dist, version, platform) in _SHOWN.items():
        elf, ptx = listed[name]["ELF"], listed[name]["PTX"]
        assert elf, name  # cuobjdump read code in every file
        sm12x_elf = {a for a in elf if a.startswith("sm_12")}
        sm12x_ptx = {"compute_" + a[3:] for a in ptx if a.startswith("sm_12")}
        if platform is None:  # onnxruntime 1.23.x: no row names them; the record's neighbours say the same
            assert not sm12x_elf and not sm12x_ptx, name
            continue
        rec = _recorded(dist, version, platform)
        assert sm12x_elf <= set(rec["sass_sm12x"]) and sm12x_ptx <= set(rec["ptx"]), (name, elf, ptx, rec)
        assert bool(sm12x_elf) == bool(rec["sass_sm12x"]), name
        assert {a for a in elf} <= set(rec["sass"]), name
    assert listed["ort-1.23.0.head.fatbin"]["PTX"] == {"sm_90a"}
    assert listed["ort-1.23.2.head.fatbin"]["PTX"] == {"sm_90"}
