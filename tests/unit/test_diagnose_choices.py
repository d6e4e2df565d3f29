"""Advice names the other values the user's own SGLang release takes for the flag the crash log shows, read from
that release's source with ast (server_args.py's add_argument choices, or arg_groups/fields in newer releases),
never from a list typed in sm120patch."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from sm120patch.triage.choices import flag_choices, server_args_file
from tests.conftest import fetch_or_skip, pristine_or_skip
from tests.unit.cli_entry import SM120PATCH

LOG = """\
[2026-01-02 10:00:00] server_args=ServerArgs(model_path='m', attention_backend='fa3', tp_size=1)
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/sglang/srt/layers/attention/flashattention_backend.py", line 40, in forward
RuntimeError: FlashAttention only supports Hopper GPUs or newer.
"""


def _listed(text: str, name: str) -> list[str]:
    """The quoted strings of the module-level list NAME, by text (not ast): the test's own reading."""
    block = text.split(f"\n{name} = [", 1)[1].split("\n]", 1)[0]
    return re.findall(r'^\s*"([^"]+)",', block, re.M)


@pytest.mark.parametrize(
    ("version", "choices_file"),
    [("0.5.9", "sglang/srt/server_args.py"), ("0.5.23", "sglang/srt/arg_groups/choices.py")],
)
def test_the_release_choices_are_read_from_its_source(version: str, choices_file: str) -> None:
    tree = pristine_or_skip("sglang", version)
    path = server_args_file(tree)
    assert path == tree / "sglang/srt/server_args.py"
    got = flag_choices(path)
    text = (tree / choices_file).read_text(encoding="utf-8")
    assert got["--attention-backend"] == _listed(text, "ATTENTION_BACKEND_CHOICES")
    assert got["--moe-runner-backend"] == _listed(text, "MOE_RUNNER_BACKEND_CHOICES")
    assert "fa3" in got["--attention-backend"]


def test_diagnose_with_target_lists_the_alternatives(tmp_path: Path) -> None:
    tree = fetch_or_skip("sglang", "0.5.9", tmp_path / "site")
    expected = [c for c in _listed((tree / "sglang/srt/server_args.py").read_text(), "ATTENTION_BACKEND_CHOICES")]
    log = tmp_path / "server.log"
    log.write_text(LOG, encoding="utf-8")
    res = CliRunner().invoke(SM120PATCH, ["diagnose", "--json", "--target", str(tree), str(log)])
    assert res.exit_code in (0, 1), res.output
    causes = [f for f in json.loads(res.stdout)["findings"] if f["fatal"]]
    with_flag = [f for f in causes if f["details"].get("flag", "").startswith("--attention-backend")]
    assert with_flag, causes
    others = [c for c in expected if c != "fa3"]
    assert with_flag[0]["details"]["alternatives"] == ", ".join(others)
    assert any(f"--attention-backend takes: {others[0]}, " in n and "(besides fa3" in n for n in with_flag[0]["notes"])


def test_a_release_without_the_file_gets_no_alternatives(tmp_path: Path) -> None:
    assert server_args_file(tmp_path) is None
    (tmp_path / "server_args.py").write_text("def broken(:\n", encoding="utf-8")
    assert flag_choices(tmp_path / "server_args.py") == {}


def test_without_target_an_sglang_log_is_read_against_the_sglang_installed_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """diagnose runs on the server's machine: the SGLang importable by its Python (found, never imported) gives the
    choices, and the note says where they came from; a vLLM log is not read against an SGLang."""
    site = fetch_or_skip("sglang", "0.5.9", tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    expected = _listed((site / "sglang/srt/server_args.py").read_text(), "ATTENTION_BACKEND_CHOICES")
    log = tmp_path / "server.log"
    log.write_text(LOG, encoding="utf-8")
    res = CliRunner().invoke(SM120PATCH, ["diagnose", "--json", str(log)])
    assert res.exit_code in (0, 1), res.output
    (cause,) = [f for f in json.loads(res.stdout)["findings"] if f["fatal"] and f["details"].get("alternatives")]
    assert cause["details"]["alternatives"] == ", ".join(c for c in expected if c != "fa3")
    note = next(n for n in cause["notes"] if "--attention-backend takes:" in n)
    assert "the SGLang installed with this Python (0.5.9)" in note and "the server may run another" in note
    assert "sglang" not in __import__("sys").modules  # found, never imported
    vllm = tmp_path / "vllm.log"
    vllm.write_text(LOG.replace("server_args=ServerArgs(", "(EngineCore pid=1) vllm config(").replace("sglang", "vllm"))
    res = CliRunner().invoke(SM120PATCH, ["diagnose", "--json", str(vllm)])
    assert not [f for f in json.loads(res.stdout)["findings"] if f["details"].get("alternatives")]
