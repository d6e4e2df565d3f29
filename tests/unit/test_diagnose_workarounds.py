"""Advice read from where a crash happened (issue 32 item 1), on hand-written logs: the library's own words when
its message says what to do, the owner of the failing code (a node pack's frame, an error qualified by its module,
the program's banner), a build script or CMake guard that has no case for the GPU, an arch check of SGLang's own
(named by its module), and the known workarounds of patches/workarounds.toml (each row with its source). A log
without a row's library or cue gets none of it; the table is loaded strictly."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sm120patch.catalogue.recipes import load_recipes
from sm120patch.errors import RecipeError
from sm120patch.triage import workarounds
from sm120patch.triage.advice import add_advice
from sm120patch.triage.diagnose import diagnose


def _advice(log: str) -> str:
    """The what-to-do text of the fatal findings, as the CLI prints it (next step and notes)."""
    d = add_advice(diagnose(io.StringIO(log), recipes=[], journal_applied=None), load_recipes())
    return "\n".join(s for f in d.causes for s in [f.next_step, *f.notes])


TB = "Traceback (most recent call last):\n"


@pytest.mark.parametrize(
    ("log", "says", "not_says"),
    [
        pytest.param(
            TB + '  File "/srv/venv/lib/python3.11/site-packages/quantlib/loader.py", line 40, in load\n'
            "    check_gpu(cfg)\n"
            "ValueError: This build has no INT8 kernel for capability 12.0; please use the FP8 checkpoint instead.\n",
            ['the error itself says what to do: "please use the FP8 checkpoint instead."'],
            [],
            id="own-words",
        ),
        pytest.param(
            "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n",
            [],
            ["the error itself says"],
            id="cuda-boilerplate-is-not-advice",
        ),
        pytest.param(
            TB + '  File "/home/u/ComfyUI/custom_nodes/ComfyUI-FancyNodes/nodes/attn.py", line 9, in fwd\n'
            "    o = kernel(q)\n"
            "RuntimeError: FancyAttention: unsupported compute capability sm_120\n",
            ["upgrade ComfyUI-FancyNodes", "nightly build"],
            [],
            id="node-pack-owner",
        ),
        pytest.param(
            "Exception: Error in widgetlib.pairwise_sum: CUDA kernel requires more dynamic shared memory than "
            "this CUDA device supports\n",
            ["upgrade widgetlib"],
            [],
            id="qualified-owner",
        ),
        pytest.param(
            "hashpump v2.4.1, build 7f3e\nRTX 5080, sm_120, driver 580.10\n"
            "CUDA_ERROR_MISALIGNED_ADDRESS (716) at batch 1\n",
            ["upgrade hashpump"],
            [],
            id="banner-owner",
        ),
        pytest.param(
            TB + '  File "setup.py", line 88, in <module>\n'
            '    FLAGS += ["-gencode", f"arch=compute_{cc},code=sm_{cc}"]\n'
            "NameError: name 'cc' is not defined\n",
            ["build script (setup.py, line 88)", "12.1 on DGX Spark"],
            [],
            id="setup-py",
        ),
        pytest.param(
            "-- CUDA target architectures: 12.1a\n-- CUDA supported target architectures: 12.1\n"
            "-- Not building fp4_gemm as no compatible archs found in CUDA target architectures\n",
            ["CMakeLists.txt lists 12.1a"],
            [],
            id="cmake-guard",
        ),
        pytest.param(
            TB + '  File "/opt/sglang/python/sglang/srt/speculative/spec_context.py", in pick_arch\n'
            '    raise ValueError(f"Unsupported compute capability: {major}.{minor}")\n'
            "ValueError: Unsupported compute capability: 12.0\n",
            ["SGLang's own, in sglang/srt/speculative/spec_context.py (pick_arch)"],
            [],
            id="sglang-own-check",
        ),
        pytest.param(
            TB + '  File "app\\asr.py", line 10, in run\n  File "faster_whisper\\transcribe.py", line 900, in encode\n'
            "RuntimeError: cuBLAS failed with status CUBLAS_STATUS_NOT_SUPPORTED\n",
            ["--compute_type float16", "whisper-standalone-win/issues/530"],
            ["disable_rht"],
            id="row-faster-whisper",
        ),
        pytest.param(
            "RuntimeError: cuBLAS failed with status CUBLAS_STATUS_NOT_SUPPORTED\n",
            [],
            ["--compute_type"],
            id="row-needs-its-library",
        ),
        pytest.param(
            "#4  ggml_cuda_op_mul_mat(ggml_backend_cuda_context&) from libggml-cuda.so\n"
            "#5  ggml_backend_cuda_graph_compute from libggml-cuda.so\n"
            "CUDA error: unspecified launch failure\n",
            ["GGML_CUDA_DISABLE_GRAPHS=1"],
            ["OLLAMA_FLASH_ATTENTION"],
            id="row-llama-cpp-graphs",
        ),
        pytest.param(
            "ptxas /tmp/k.ptx, line 12; error   : Instruction 'tcgen05.mma' not supported on .target 'sm_121a'\n",
            ["tcgen05", "SM100 family only", "mma"],
            [],
            id="row-tcgen05",
        ),
        pytest.param(
            "INFO Using 'FLASHINFER_B12X' MoE backend\nRuntimeError: CUDA error: an illegal memory access was "
            "encountered\n",
            ["--moe-backend flashinfer_cutlass", "--moe-runner-backend flashinfer_cutlass"],
            [],
            id="row-b12x",
        ),
        pytest.param(
            "ggml_cuda_compute_forward: FLASH_ATTN_EXT failed\n"
            "CUDA error: an illegal memory access was encountered\n",
            ["-fa off", "OLLAMA_FLASH_ATTENTION=0"],
            ["GGML_CUDA_DISABLE_GRAPHS"],
            id="row-llama-cpp-flash-attention-fault",
        ),
        pytest.param(
            TB + '  File "/srv/venv/lib/python3.12/site-packages/deep_gemm/jit/compiler.py", line 88, in build\n'
            "    raise RuntimeError(msg)\n"
            "RuntimeError: CUDA error: no kernel image is available for execution on the device\n",
            ["VLLM_USE_DEEP_GEMM=0", "SGLANG_ENABLE_JIT_DEEPGEMM=0"],
            [],
            id="row-deepgemm-off",
        ),
        pytest.param(
            "out = torch._scaled_mm(x, w, scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)\n"
            "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul(...)\n",
            ["per-tensor (tensorwise) scales"],
            [],
            id="row-scaled-mm-rowwise",
        ),
        pytest.param(
            "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul(...)\n",
            [],
            ["per-tensor (tensorwise) scales", "VLLM_USE_DEEP_GEMM"],
            id="row-scaled-mm-needs-scaled-mm",
        ),
        pytest.param(
            'AssertionError: FP8 is only supported on SM100 (compute capability 10.x) for FA4 (CuTe DSL) kernels\n',
            ["--attention-backend flashinfer", "VLLM_ATTENTION_BACKEND=FLASHINFER"],
            [],
            id="row-fa4-fp8-sm100",
        ),
        pytest.param(
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, unhandled cuda error\n"
            "Last error:\nCuda failure 'peer access is not supported between these two devices'\n",
            ["ACSCtl", "NCCL_P2P_DISABLE=1"],
            [],
            id="row-nccl-p2p-acs",
        ),
        pytest.param(
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited "
            "or there was a network error\nNET/Socket : Connect to 10.0.0.2<43125> failed : Connection refused\n",
            [],
            ["ACSCtl"],
            id="row-nccl-p2p-needs-p2p",
        ),
        pytest.param(
            "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 116992, "
            "Hardware limit: 101376\n",
            ["tile sizes", "TILE_SIZE"],
            ["b12x"],
            id="triton-tile-sizes",
        ),
    ],
)
def test_advice_from_where_it_failed(log: str, says: list[str], not_says: list[str]) -> None:
    text = _advice(log)
    for s in says:
        assert s in text, f"{s!r} not in:\n{text}"
    for s in not_says:
        assert s not in text, f"{s!r} in:\n{text}"


def test_every_row_of_the_shipped_table_loads_and_has_a_source() -> None:
    rows = workarounds.load()
    assert rows and len({r.id for r in rows}) == len(rows)
    assert all(r.source.startswith("https://") and r.advice.strip() for r in rows)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('[[workaround]]\nid = "a"\nlibraries = []\ncue = "x"\nadvice = "y"\n', "give exactly"),
        ('[[workaround]]\nid = "a"\nlibraries = []\ncue = "("\nadvice = "y"\nsource = "https://e"\n', "cue"),
        ('[[workaround]]\nid = "a"\nlibraries = []\ncue = "x"\nadvice = "y"\nsource = "http://e"\n', "https"),
        ('[[workaround]]\nid = "a"\nlibraries = "ggml"\ncue = "x"\nadvice = "y"\nsource = "https://e"\n', "list"),
        ('[[fix]]\nid = "a"\n', "unknown table"),
    ],
)
def test_a_broken_table_is_one_line_naming_the_file(tmp_path: Path, body: str, says: str) -> None:
    p = tmp_path / "workarounds.toml"
    p.write_text(body, encoding="utf-8")
    with pytest.raises(RecipeError) as e:
        workarounds.load(p)
    assert str(p) in str(e.value) and says in str(e.value) and "\n" not in str(e.value)
