"""Next steps read from a crash log's own evidence (issue 32 item 1), on hand-written lines: the CUDA major a missing
runtime library names gets the wheel index that fits it, a Triton shared-memory limit its knobs (num_stages, block
sizes), a Gloo socket failure the interface variables; a line without the cue gets none of them. Also the library
from frames and .so names, the flag whose value picked the path, build arch lists and versions; and that the CLI,
guard and the scorer read the advice from one library function (advice.add_advice)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sm120patch.catalogue.recipes import load_recipes
from sm120patch.triage.advice import add_advice
from sm120patch.triage.diagnose import diagnose
from sm120patch.triage.guard import GuardLog
from tests.unit.cli_entry import SM120PATCH


def _notes(tmp_path: Path, log: str) -> str:
    p = tmp_path / "server.log"
    p.write_text(log, encoding="utf-8")
    res = CliRunner().invoke(SM120PATCH, ["diagnose", "--json", "--quiet", str(p)])
    assert res.exit_code in (0, 1), res.output
    return " ".join(n for f in json.loads(res.stdout)["findings"] if f["fatal"] for n in f["notes"])


@pytest.mark.parametrize(
    ("log", "says", "not_says"),
    [
        (
            "ImportError: libcudart.so.13: cannot open shared object file: No such file or directory\n",
            ["CUDA 13", "https://download.pytorch.org/whl/cu130", "torch.version.cuda"],
            ["num_stages", "GLOO_SOCKET_IFNAME"],
        ),
        (
            "Traceback (most recent call last):\n"
            '  File "/opt/venv/lib/python3.12/site-packages/sgl_kernel/__init__.py", line 5, in <module>\n'
            "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory\n",
            ["CUDA 12", "https://download.pytorch.org/whl/cu128"],
            ["num_stages"],
        ),
        (
            "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 135168, "
            "Hardware limit: 101376. Reducing block sizes or `num_stages` may help.\n",
            ["num_stages (e.g. 2)", "BLOCK_M"],
            ["cu128", "GLOO_SOCKET_IFNAME"],
        ),
        (
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:144] Gloo connectFullMesh failed with "
            "Connection refused: socket interface\n",
            ["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"],
            ["num_stages", "cu128"],
        ),
        ("RuntimeError: CUDA error: an illegal memory access was encountered\n", [], ["num_stages", "cu1", "GLOO"]),
    ],
)
def test_advice_from_the_evidence(tmp_path: Path, log: str, says: list[str], not_says: list[str]) -> None:
    notes = _notes(tmp_path, log)
    assert all(s in notes for s in says), notes
    assert not any(s in notes for s in not_says), notes


G5090 = "[2026-01-02 10:00:00] GPU 0: NVIDIA GeForce RTX 5090 (compute capability 12.0)\n"


def _advised(log: str) -> list:
    """The fatal findings of LOG with the advice added, as the CLI adds it (no recipes, no --target)."""
    result = add_advice(diagnose(log.splitlines(keepends=True), [], None), [], None)
    causes = result.causes
    assert causes, result.render()
    return causes


def _text(causes: list) -> str:
    return "\n".join([f.next_step for f in causes] + [n for f in causes for n in f.notes])


def test_flash_attention_failure_in_a_moe_model_names_the_attention_flag_not_the_moe_one() -> None:
    """The failing line is FlashAttention's: the MoE model's frames around it do not make it the MoE backend's."""
    log = (
        G5090
        + "server_args=ServerArgs(attention_backend='fa3', moe_runner_backend='flashinfer_trtllm')\n"
        + "Traceback (most recent call last):\n"
        + '  File "/x/site-packages/sglang/srt/models/qwen3_moe.py", line 300, in forward\n'
        + '  File "/x/site-packages/sglang/srt/layers/attention/flashattention_backend.py", line 40, in forward\n'
        + "RuntimeError: FlashAttention only supports Hopper GPUs or newer.\n"
    )
    causes = _advised(log)
    flags = [f.details.get("flag", "") for f in causes]
    assert "--attention-backend fa3" in flags, flags
    assert not any(f.startswith("--moe") for f in flags), flags


def test_fa3_on_sm12x_says_flash_attention_2() -> None:
    log = (
        G5090
        + "Traceback (most recent call last):\n"
        + '  File "/x/site-packages/flash_attn_interface.py", line 12, in flash_attn_func\n'
        + "RuntimeError: FlashAttention-3 only supports Hopper GPUs\n"
    )
    text = _text(_advised(log))
    assert "FlashAttention 2" in text and "SDPA" in text, text


def test_a_package_no_pattern_knows_is_named_from_its_frame_and_upgraded() -> None:
    log = (
        G5090
        + "Traceback (most recent call last):\n"
        + '  File "/opt/venv/lib/python3.12/site-packages/frobnicator/kernels/dispatch.py", line 88, in run\n'
        + "RuntimeError: this kernel is only supported on sm_90 and sm_100\n"
    )
    causes = _advised(log)
    assert causes[0].details.get("library") == "frobnicator", causes[0].details
    assert "upgrade frobnicator" in _text(causes)


def test_a_binary_without_the_arch_gets_the_build_lists_with_the_spark_arch() -> None:
    log = (
        "GPU 0: NVIDIA GB10 (compute capability 12.1)\n"
        "CUDA error: no kernel image is available for execution on the device\n"
    )
    text = _text(_advised(log))
    assert "CMAKE_CUDA_ARCHITECTURES=121" in text and 'TORCH_CUDA_ARCH_LIST="12.1"' in text, text


def test_a_shared_memory_limit_outside_triton_names_the_tile_and_stages() -> None:
    log = G5090 + "RuntimeError: CUTLASS kernel requires 229376 bytes of shared memory, exceeds the device limit\n"
    text = _text(_advised(log)).lower()
    assert "tile size" in text and "num_stages" in text, text


def test_flashinfer_jit_nvcc_without_the_arch_needs_cuda_12_9() -> None:
    log = (
        G5090
        + "flashinfer.jit: Building module gen_gemm_sm120\n"
        + "nvcc fatal   : Unsupported gpu architecture 'compute_120f'\n"
    )
    text = _text(_advised(log))
    assert "CUDA >= 12.9" in text, text


def test_the_cli_gives_the_advice_the_library_adds(tmp_path: Path) -> None:
    """`diagnose --json` carries exactly the notes add_advice gives the same log with the shipped recipes."""
    log_text = G5090 + "CUDA error: no kernel image is available for execution on the device\n"
    log = tmp_path / "server.log"
    log.write_text(log_text, encoding="utf-8")
    res = CliRunner().invoke(SM120PATCH, ["diagnose", "--json", str(log)])
    cli_notes = [f["notes"] for f in json.loads(res.stdout)["findings"] if f["fatal"]]
    recipes = load_recipes()
    lib = add_advice(diagnose(log_text.splitlines(keepends=True), recipes, None), recipes, None)
    assert cli_notes == [f.notes for f in lib.causes] and any("CMAKE_CUDA_ARCHITECTURES" in n for n in cli_notes[0])


def test_guard_log_file_holds_the_visible_text_not_raw_control_characters(tmp_path: Path) -> None:
    path = tmp_path / "guard.log"
    log = GuardLog(stream=io.StringIO(), path=path)
    log("last error line 3: boom\x1b]52;c;aGk=\x07 done")
    log.close()
    text = path.read_text(encoding="utf-8")
    assert "\x1b" not in text and "\x07" not in text and "\\x1b]52;c;aGk=\\x07 done" in text, text
