"""`sm120patch gates` on small trees written here: each predicate shape, guard clauses, a moved
site, a `__CUDA_ARCH__` range, FlashInfer's JIT majors, the verdicts, the diff, the JSON shape.

The expected admitted archs below are worked out by hand from the predicate definitions each tree
writes, not from the scanner."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from sm120patch.catalogue.kernels import load_kernels
from sm120patch.cli import run
from sm120patch.gates import gate_map
from sm120patch.gates.cuda_arch import evaluate, scan_text
from sm120patch.gates.diff import diff_sites
from sm120patch.gates.scan import scan_target
from sm120patch.gates.site import CANDIDATE, OPEN, SHUT, UNKNOWN
from sm120patch.planning.targets import discover

UTILS = """
from functools import lru_cache, partial
import torch

def is_cuda():
    return True

def _check_cuda_device_version(device_capability_majors, cuda_version):
    if not is_cuda():
        return False
    return (
        torch.cuda.get_device_capability()[0] in device_capability_majors
        and tuple(map(int, torch.version.cuda.split(".")[:2])) >= cuda_version
    )

is_blackwell_supported = is_blackwell = lru_cache(maxsize=1)(
    partial(_check_cuda_device_version, device_capability_majors=[10, 11, 12], cuda_version=(12, 8))
)
is_sm120_supported = lru_cache(maxsize=1)(
    partial(_check_cuda_device_version, device_capability_majors=[12], cuda_version=(12, 8))
)
is_sm100_supported = lru_cache(maxsize=1)(
    partial(_check_cuda_device_version, device_capability_majors=[10], cuda_version=(12, 8))
)
is_sm90_supported = lru_cache(maxsize=1)(
    partial(_check_cuda_device_version, device_capability_majors=[9], cuda_version=(12, 3))
)

@lru_cache(maxsize=1)
def is_sm120() -> bool:
    return is_cuda() and torch.cuda.get_device_capability() == (12, 0)
"""

PLATFORM = """
_PLATFORM_PROBES = {
    "is_cuda": "is_cuda",
    "is_sm90": "is_sm90_supported",
    "is_sm100": "is_sm100_supported",
    "is_sm120": "is_sm120_supported",
    "is_blackwell": "is_blackwell_supported",
}
_PLATFORM_VALUES = {"device_capability": "get_device_capability"}

def get_platform():
    ...
"""

GATES = """
import torch
from sglang.srt.utils.common import is_cuda, is_sm90_supported, is_sm100_supported, is_sm120, is_blackwell
from sglang.srt.runtime_context import get_platform

_is_cuda = is_cuda()
_is_sm100_supported = _is_cuda and is_sm100_supported()
_is_sm90_supported = _is_cuda and is_sm90_supported()


def fusion_applies(x):
    return (_is_sm90_supported or _is_sm100_supported) and x > 0


def attention_default(cfg):
    if get_platform().is_sm100:
        return "trtllm_mha"
    elif get_platform().is_sm90:
        return "fa3"
    return "triton"


def prefill_default():
    sm_major = torch.cuda.get_device_capability()[0] if is_cuda() else 0
    if sm_major not in (9, 10):
        return None
    return "flashinfer"


class Runner:
    def tma_ok(self):
        major, _ = torch.cuda.get_device_capability()
        return major >= 10 and major != 12

    def exact(self):
        if is_sm120():
            return "rtx"
        return "other"


def moe_default(cfg):
    cc = torch.cuda.get_device_capability()
    backend = "flashinfer_trtllm" if cc >= (10, 0) and cc < (11, 0) else "triton"
    return backend


def fp4(cfg):
    if is_sm100_supported():
        return mm_fp4(cfg, backend="cutlass")
    return None


def blackwell_default():
    if is_blackwell():
        return "flashinfer_cutlass"
    return "triton"


def fa4_path():
    if not get_platform().is_sm100:
        return "mha_chunked_kv"
    return "fa4"


def unread():
    if is_sm130_supported():
        return 1
    return 0
"""


def _sglang(root: Path, gates: str = GATES, version: str = "0.5.99", extra: dict[str, str] | None = None) -> Path:
    pkg = root / "sglang"
    files = {
        "__init__.py": "",
        "version.py": f'__version__ = "{version}"\n',
        "srt/__init__.py": "",
        "srt/utils/__init__.py": "",
        "srt/utils/common.py": UTILS,
        "srt/runtime_context.py": PLATFORM,
        "srt/layers/gates.py": gates,
        **(extra or {}),
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(textwrap.dedent(text))
    return root


def _flashinfer(root: Path, comm_majors: str = "[9, 10, 12]") -> Path:
    pkg = root / "flashinfer"
    files = {
        "__init__.py": '__version__ = "0.9.0"\n',
        "jit/__init__.py": "",
        "jit/comm.py": f"""
            def gen_trtllm_comm_module():
                nvcc_flags = current_compilation_context.get_nvcc_flags_list(
                    supported_major_versions={comm_majors}
                )
                return nvcc_flags
            """,
        "jit/fused_moe.py": """
            def gen_cutlass_fused_moe_sm120_module():
                return get_nvcc_flags_list(supported_major_versions=[12])

            def gen_trtllm_gen_fused_moe_sm100_module():
                majors = [10]
                return get_nvcc_flags_list(supported_major_versions=majors)
            """,
        "data/include/flashinfer/comm/ar.cuh": """
            namespace flashinfer {
            template <typename T>
            __global__ void __launch_bounds__(128) lamport_kernel(T* out) {
            #if (defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && (__CUDA_ARCH__ < 1200))
              out[0] = 1;
            #endif
            #if __CUDA_ARCH__ >= 1000 && defined(__CUDA_ARCH_FEAT_SM100_ALL)
              out[1] = 2;
            #endif
            }
            }  // namespace flashinfer
            """,
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(textwrap.dedent(text))
    return root


def _sites(root: Path) -> dict[tuple[str, str], list]:
    scan = scan_target(discover(root, "sglang")[0])
    out: dict[tuple[str, str], list] = {}
    for s in scan.sites:
        out.setdefault((s.function, s.test), []).append(s)
    return out


def test_each_predicate_shape_admits_what_its_definition_says(tmp_path: Path) -> None:
    sites = _sites(_sglang(tmp_path))
    got = {k: v[0].path for k, v in sites.items()}
    # module flags built from partial(_check_cuda_device_version, majors=[9]) / [10]
    assert got[("fusion_applies", "(_is_sm90_supported or _is_sm100_supported) and x > 0")] == [
        "sm_90",
        "sm_100",
        "sm_103",
    ]
    # get_platform() attributes through the release's own _PLATFORM_PROBES
    assert got[("attention_default", "get_platform().is_sm100")] == ["sm_100", "sm_103"]
    assert got[("attention_default", "get_platform().is_sm90")] == ["sm_90"]
    # a guard clause: the code after it runs where the test is false
    assert got[("prefill_default", "sm_major not in (9, 10)")] == ["sm_90", "sm_100", "sm_103"]
    assert sites[("prefill_default", "sm_major not in (9, 10)")][0].guard
    # a negated test that returns a fallback: the fast path after it runs where the test is false
    assert got[("fa4_path", "not get_platform().is_sm100")] == ["sm_100", "sm_103"]
    # a tuple-unpacked capability, in a method: qualified name
    assert got[("Runner.tma_ok", "major >= 10 and major != 12")] == ["sm_100", "sm_103", "sm_110"]
    # an exact-minor helper defined as a function: SM121 is out
    assert got[("Runner.exact", "is_sm120()")] == ["sm_120"]
    # tuple comparisons of the capability
    assert got[("moe_default", "cc >= (10, 0) and cc < (11, 0)")] == ["sm_100", "sm_103"]
    assert got[("blackwell_default", "is_blackwell()")] == ["sm_100", "sm_103", "sm_110", "sm_120", "sm_121"]
    # a predicate-shaped name the release never defines: unknown, never guessed
    assert got[("unread", "is_sm130_supported()")] is None
    # flags and local bindings are definitions, not sites of their own
    assert not [k for k in sites if k[1].startswith("_is_cuda and")]
    assert not [k for k in sites if k[1] == "torch.cuda.get_device_capability()"]


def test_predicates_are_read_from_the_release(tmp_path: Path) -> None:
    scan = scan_target(discover(_sglang(tmp_path), "sglang")[0])
    preds = {p.name: p.admits for p in scan.predicates if p.scope == "release"}
    assert preds["is_sm120_supported"] == ["sm_120", "sm_121"]
    assert (
        preds["is_blackwell"] == preds["is_blackwell_supported"] == ["sm_100", "sm_103", "sm_110", "sm_120", "sm_121"]
    )
    assert preds["is_sm120"] == ["sm_120"]
    flags = {p.name: p.admits for p in scan.predicates if p.scope == "module"}
    assert flags["_is_sm100_supported"] == ["sm_100", "sm_103"]


def test_verdicts_against_a_flashinfer(tmp_path: Path) -> None:
    root = _sglang(tmp_path / "sg")
    fi_root = _flashinfer(tmp_path / "fi")
    from sm120patch.probes.environment.flashinfer import from_tree

    m = gate_map(discover(root, "sglang")[0], [], load_kernels(), from_tree(fi_root), with_recipes=False)
    by = {(s.function, s.test): s for s in m.sites}
    # fusion: trtllm_comm? no word for it in this guarded code -> unknown; the attention default names
    # trtllm_mha: FlashInfer's fmha_v2 generator is not in this tree, so the static rung says unknown
    assert by[("fusion_applies", "(_is_sm90_supported or _is_sm100_supported) and x > 0")].verdict == UNKNOWN
    # moe_default guards flashinfer_trtllm: trtllm-gen MoE has no SM12x cubins (catalogue) -> right to stay shut
    moe = by[("moe_default", "cc >= (10, 0) and cc < (11, 0)")]
    assert moe.verdict == SHUT and moe.kernels == ["flashinfer:trtllm_gen_moe"]
    # blackwell_default admits SM12x: open
    assert by[("blackwell_default", "is_blackwell()")].verdict == OPEN
    # candidates sort first
    order = [s.verdict for s in m.sites]
    assert order == sorted(order, key=[CANDIDATE, UNKNOWN, "covered", SHUT, OPEN].index)


def test_a_gate_whose_kernels_flashinfer_has_is_a_candidate(tmp_path: Path) -> None:
    gates = (
        GATES
        + """

def moe_backend(cfg):
    if get_platform().is_sm100:
        return "flashinfer_cutlass"
    return "triton"
"""
    )
    root = _sglang(tmp_path / "sg", gates)
    from sm120patch.probes.environment.flashinfer import from_tree

    m = gate_map(
        discover(root, "sglang")[0], [], load_kernels(), from_tree(_flashinfer(tmp_path / "fi")), with_recipes=False
    )
    site = next(s for s in m.sites if s.function == "moe_backend")
    assert site.verdict == CANDIDATE and site.kernels == ["flashinfer:cutlass_fused_moe_sm120"]
    assert "supported_major_versions=[12]" in site.reason
    assert m.sites[0].verdict == CANDIDATE
    # without a FlashInfer the same gate is unknown, not a candidate
    m2 = gate_map(discover(root, "sglang")[0], [], load_kernels(), None, with_recipes=False)
    assert next(s for s in m2.sites if s.function == "moe_backend").verdict == UNKNOWN


def test_flashinfer_jit_majors_and_cuda_arch_ranges(tmp_path: Path) -> None:
    scan = scan_target(discover(_flashinfer(tmp_path, "[9, 10]"), "flashinfer")[0])
    by = {(s.kind, s.function): s for s in scan.sites}
    assert by[("jit-majors", "gen_trtllm_comm_module")].path == ["sm_90", "sm_100", "sm_103"]
    # a list bound to a local name is read through it
    assert by[("jit-majors", "gen_trtllm_gen_fused_moe_sm100_module")].path == ["sm_100", "sm_103"]
    cuda = [s for s in scan.sites if s.kind == "cuda-arch"]
    assert [s.line for s in cuda] == [5, 8]
    assert cuda[0].function == "lamport_kernel"
    # >= 900 and < 1200: SM12x compiled out (the FlashInfer PR 3903 bug)
    assert cuda[0].path == ["sm_90", "sm_100", "sm_103", "sm_110"]
    # the feature macro is defined only for sm_100a
    assert cuda[1].path == ["sm_100"]


def test_cuda_arch_conditions() -> None:
    assert evaluate("__CUDA_ARCH__ >= 800 && __CUDA_ARCH__ < 900") == {a for a in _archs(("sm_80", "sm_89"))}
    assert evaluate("!(__CUDA_ARCH__ < 1000) || FOO") is not None
    assert [a.name for a in sorted(evaluate("__CUDA_ARCH__ == 1210") or ())] == ["sm_121"]
    assert evaluate("__CUDA_ARCH__ >= (") is None  # does not parse: unknown
    # a bare defined(__CUDA_ARCH__) is the host/device split, not an arch gate
    assert scan_text("flashinfer", "x.cuh", "#ifdef __CUDA_ARCH__\n#endif\n#if defined(__CUDA_ARCH__)\n#endif\n") == []


def _archs(names: tuple[str, ...]) -> set:
    from sm120patch.arch import parse_arch

    return {parse_arch(n) for n in names}


BLACKWELL_DEFAULT = (
    'def blackwell_default():\n    if is_blackwell():\n        return "flashinfer_cutlass"\n    return "triton"\n'
)


def test_a_moved_site_is_moved_not_added_and_removed(tmp_path: Path) -> None:
    old = _sites(_sglang(tmp_path / "old"))
    moved = GATES.replace("def fusion_applies(x):", "def fusion_applies_v2(x):")
    moved = moved.replace(
        BLACKWELL_DEFAULT,
        "",
    )
    new_root = _sglang(
        tmp_path / "new",
        moved + "\n\ndef added():\n    return is_sm90_supported() or is_sm120()\n",
        extra={
            "srt/layers/other.py": GATES[GATES.index("import torch") : GATES.index("def fusion_applies")]
            + BLACKWELL_DEFAULT
        },
    )
    d = diff_sites([s for v in old.values() for s in v], [s for v in _sites(new_root).values() for s in v])
    moves = {(m.old.function, m.new.function, m.old.file, m.new.file) for m in d.moved}
    assert ("fusion_applies", "fusion_applies_v2", "sglang/srt/layers/gates.py", "sglang/srt/layers/gates.py") in moves
    assert (
        "blackwell_default",
        "blackwell_default",
        "sglang/srt/layers/gates.py",
        "sglang/srt/layers/other.py",
    ) in moves
    assert [(s.function, s.test) for s in d.added] == [("added", "is_sm90_supported() or is_sm120()")]
    assert d.removed == []
    assert d.unchanged >= 8


def test_cli_json_shape_and_exit_codes(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    root = _sglang(tmp_path / "sg")
    assert run(["gates", str(root), "--json", "--flashinfer", str(_flashinfer(tmp_path / "fi"))]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["schema", "tree", "flashinfer", "counts", "sites", "recipes", "predicates", "notes"]
    assert list(data["tree"]) == ["package", "version", "root", "files", "parsed", "sites"]
    assert list(data["counts"]) == ["candidate", "unknown", "covered", "shut", "open"]
    assert list(data["sites"][0]) == [
        "package", "file", "function", "line", "end_line", "test", "kind", "guard", "admits", "path",
        "verdict", "reason", "recipe", "recipe_status", "kernels", "defined_at",
    ]  # fmt: skip
    assert data["flashinfer"]["location"].endswith("flashinfer")
    assert run(["gates", str(root), str(root), "--json"]) == 0
    diff = json.loads(capsys.readouterr().out)
    assert list(diff) == ["schema", "old", "new", "added", "removed", "moved", "changed", "unchanged", "recipes"]
    assert diff["added"] == diff["removed"] == diff["moved"] == [] and diff["unchanged"] == len(data["sites"])
    assert run(["gates", str(root), "--markdown"]) == 0
    assert "| file:line | function | test | runs on | why |" in capsys.readouterr().out
    # bad input: one line, exit 2
    assert run(["gates", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file or folder" in err
    assert run(["gates", str(root), "--json", "--markdown"]) == 2
