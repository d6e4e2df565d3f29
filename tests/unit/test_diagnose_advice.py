"""Next steps read from a crash log's own evidence (issue 32 item 1), on hand-written lines: the CUDA major a missing
runtime library names gets the wheel index that fits it, a Triton shared-memory limit its knobs (num_stages, block
sizes), a Gloo socket failure the interface variables; a line without the cue gets none of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

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
