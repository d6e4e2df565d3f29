"""The advice names the library where the failure is, from the traceback's frames and the .so a line names
(DeepGEMM, FlashMLA, tilelang, CUTLASS), on hand-written lines: structural findings name it in their next step,
catalogue findings in their details."""

from __future__ import annotations

import pytest

from sm120patch.triage.diagnose import diagnose
from tests.unit.triage_lines import assert_prefilter_keeps

FRAME = '  File "/opt/venv/lib/python3.12/site-packages/{path}", line 90, in build\n'


@pytest.mark.parametrize(
    ("log", "library"),
    [
        (
            "Traceback (most recent call last):\n"
            + FRAME.format(path="deep_gemm/jit/compiler.py")
            + "RuntimeError: DeepGEMM only supports SM90 and SM100\n",
            "deep_gemm",
        ),
        (
            "Traceback (most recent call last):\n"
            + FRAME.format(path="tilelang/jit/kernel.py")
            + "ValueError: Unsupported target sm_120 for tcgen05\n",
            "tilelang",
        ),
        ("RuntimeError: cutlass::Status::kErrorArchMismatch: built for sm_100a, not sm_120\n", "cutlass"),
        (
            "RuntimeError: CUDA error: no kernel image is available for execution on the device "
            "(in /opt/venv/lib/python3.12/site-packages/flash_mla_cuda.cpython-312-x86_64-linux-gnu.so)\n",
            "flash_mla",
        ),
    ],
)
def test_the_library_is_named(log: str, library: str) -> None:
    d = diagnose(log.splitlines(True), [], None).to_dict()
    causes = [f for f in d["findings"] if f["fatal"]]
    assert causes and causes[0]["details"].get("library") == library, causes
    if causes[0]["source"] == "structure":
        assert library in causes[0]["next_step"]
    assert_prefilter_keeps(log)
