"""The shipped check scripts' own arithmetic, on CPU under the spec venv's torch.

The kernels need a GPU, but the references they are judged against do not: the fused-MoE
reference must equal a token-by-token MoE, its NVFP4 decoding must invert the packing and the
128x4 swizzled scale layout, and the harness's comparison must never let NaN pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sm120patch.probes.run.rung import CHECKS_DIR
from tests.integration.fi_releases import spec_venv

SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys
    import torch

    def load(name):
        spec = importlib.util.spec_from_file_location(name, f"{sys.argv[1]}/{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    moe, harness = load("fused_moe"), load("harness")
    torch.manual_seed(0)
    out = {}

    # the MoE reference against a token-by-token, slot-by-slot MoE
    E, K, H, I, T = 4, 2, 32, 16, 9
    x = torch.randn(T, H)
    w31, w2 = torch.randn(E, 2 * I, H) / 4, torch.randn(E, H, I) / 4
    weights, experts = moe._routing(torch.randn(T, E))
    ref = moe._moe_reference(x, w31, w2, weights, experts)
    naive = torch.zeros(T, H)
    for t in range(T):
        for s in range(K):
            e = int(experts[t, s])
            w3, w1 = w31[e, :I], w31[e, I:]
            inter = torch.nn.functional.silu(w1 @ x[t]) * (w3 @ x[t])
            naive[t] += weights[t, s] * (w2[e] @ inter)
    out["moe_max_diff"] = float((ref - naive).abs().max())
    out["weights_sum"] = float(weights.sum(-1).sub(1).abs().max())
    out["top_k_distinct"] = bool((experts[:, 0] != experts[:, 1]).all())

    # NVFP4: pack known e2m1 codes and e4m3 scales the documented way, decode with the check
    M, N = 128, 64
    codes = torch.randint(0, 16, (M, N))
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    scales = (torch.rand(M, N // 16) * 4 + 0.25).to(torch.float8_e4m3fn)
    # linear [row, col] -> swizzled [row tile, col tile, row % 32, (row % 128) // 32, col % 4]
    lin = scales.view(torch.uint8).reshape(M // 128, 4, 32, (N // 16) // 4, 4)
    swz = lin.permute(0, 3, 2, 1, 4).contiguous().flatten()
    gs = torch.tensor([2.0])
    got = moe._dequant_fp4(packed, swz, gs)
    table = torch.tensor(moe.E2M1)
    vals = table[codes & 7] * torch.where((codes & 8) > 0, -1.0, 1.0)
    want = vals * scales.float().repeat_interleave(16, dim=1) / 2.0
    out["fp4_max_diff"] = float((got - want).abs().max())

    # the harness's comparison: NaN is bad, shapes must match, the bound is elementwise
    ctx = harness.Ctx("rank", {"devices": [0]})
    r = torch.ones(4, 4)
    out["cmp_ok"] = ctx.compare("same", r + 0.01, r, 0.05, 0.0)
    bad = r.clone(); bad[0, 0] = float("nan")
    out["cmp_nan"] = ctx.compare("nan", bad, r, 0.05, 0.0)
    out["cmp_rel"] = ctx.compare("rel", r * 1.5, r, 0.0, 0.4)
    out["cmp_shape"] = ctx.compare("shape", r[:2], r, 0.05, 0.0)
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def results() -> dict:
    py = spec_venv()
    p = subprocess.run([str(py), "-c", SCRIPT, str(CHECKS_DIR)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.network
def test_moe_reference_is_a_plain_top_k_moe(results: dict) -> None:
    assert results["moe_max_diff"] < 1e-4
    assert results["weights_sum"] < 1e-6 and results["top_k_distinct"]


@pytest.mark.network
def test_nvfp4_decoding_inverts_the_packing_and_the_swizzle(results: dict) -> None:
    assert results["fp4_max_diff"] == 0.0


@pytest.mark.network
def test_the_comparison_never_lets_nan_pass(results: dict) -> None:
    assert results["cmp_ok"]["ok"] and results["cmp_ok"]["n_bad"] == 0
    nan = results["cmp_nan"]
    assert not nan["ok"] and nan["n_bad"] == 1 and nan["n_nonfinite"] == 1
    assert not results["cmp_rel"]["ok"] and results["cmp_rel"]["n_bad"] == 16  # 0.5 > 0.4*|1|
    assert not results["cmp_shape"]["ok"] and "shape" in results["cmp_shape"]["error"]


# --- the reduced fused-MoE module's stubs: a module that lost units still loads, and says so if called ---

USER_CPP = """
namespace tensorrt_llm { struct Runner { virtual ~Runner(); virtual int run(); };
int dropped_launcher(int);
extern "C" int kept(int x) { return x + 1; }
extern "C" int calls_dropped(int x) { return dropped_launcher(x); }
extern "C" void* makes_dropped() { return new Runner(); } }
"""


def _moe_reduced():  # noqa: ANN202
    import importlib.util

    spec = importlib.util.spec_from_file_location("moe_reduced", CHECKS_DIR / "moe_reduced.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.needs("c++", "nm", why="builds a host module to load with stubs")
def test_stubs_let_a_module_with_dropped_units_load_and_a_call_into_one_abort_by_name(tmp_path: Path) -> None:
    moe = _moe_reduced()
    (tmp_path / "user.cpp").write_text(USER_CPP)
    so = tmp_path / "mod.so"
    build = ["c++", "-shared", "-fPIC", "-o", str(so), str(tmp_path / "user.cpp")]
    subprocess.run(build, check=True, timeout=120)
    load = "import ctypes, sys; m = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL | 2); print(m.kept(41))"
    r = subprocess.run([sys.executable, "-c", load, str(so)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "undefined symbol" in r.stderr  # RTLD_NOW: what a dropped unit does
    symbols = moe.missing_symbols(so)
    assert "_ZN12tensorrt_llm16dropped_launcherEi" in symbols and any(s.startswith("_ZTV") for s in symbols)
    (tmp_path / "stubs.cpp").write_text(moe.stub_source(symbols))
    subprocess.run([*build, str(tmp_path / "stubs.cpp")], check=True, timeout=120)
    r = subprocess.run([sys.executable, "-c", load, str(so)], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, "42"), r.stderr
    call = load.replace("print(m.kept(41))", "m.calls_dropped(1)")
    r = subprocess.run([sys.executable, "-c", call, str(so)], capture_output=True, text=True, timeout=60)
    assert r.returncode < 0 and "_ZN12tensorrt_llm16dropped_launcherEi was not built" in r.stderr


def test_the_bf16_filter_reads_every_spelling_of_another_type() -> None:
    moe = _moe_reduced()
    keep = (
        "INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM(Sm90, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, void, NONE, 128);"
    )
    assert moe.keeps(keep)
    for other in ("half", "__nv_fp8_e4m3", "cutlass::uint4b_t", "Fp4Type", "cutlass::float_e2m1_t", "uint8_t"):
        assert not moe.keeps(keep.replace("__nv_bfloat16, void", f"{other}, void")), other
    sm80 = "template void sm80_launcher<cutlass::bfloat16_t, cutlass::bfloat16_t, 16, 128>(float const* a);"
    assert moe.keeps(sm80)  # a float in the parameter list is not an element type
    text = (
        "#include <x>\nnamespace a {\n#if 1\n"
        + keep
        + "\n#endif\n\n#if 1\n"
        + keep.replace("__nv_bfloat16, void", "half, void")
        + "\n#endif\n}\n"
    )
    out, kept, of = moe.filter_generated(text)
    assert (kept, of) == (1, 2) and "half" not in out and out.startswith("#include <x>") and out.endswith("}\n")
