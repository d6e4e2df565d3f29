"""`sm120patch census`, and `preflight` where no SGLang is installed (issue 30 item 3, issue 36 item 3).

Run as a user runs them, in a child process, on site-packages built here from nvcc's output:
a torch whose CUDA library nvcc built for sm_120a only (by the documented rules [FEAT] it has no
image for 12.1) and a package built for plain sm_120 (runs on 12.0 and 12.1 [BIN]).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_census_nvcc import build_fatbins

NO_IMAGE = "CUDA error: no kernel image is available for execution on the device"


@pytest.fixture(scope="module")
def built() -> Path:
    return build_fatbins()


def _site(root: Path, built: Path, torch_file: str = "sm_120a.so") -> Path:
    site = root / "site"
    for dist, version, rel, src in (
        ("torch", "2.9.0", "torch/lib/libtorch_cuda.so", torch_file),
        ("tiny", "1.0", "tiny/_C.so", "sm_120.so"),
    ):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(built / src, site / rel)
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir()
        (info / "RECORD").write_text(f"{rel},,\n")
    return site


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("SM120PATCH_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "sm120patch", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def test_census_text_json_and_markdown_without_sglang(tmp_path: Path, built: Path) -> None:
    site = _site(tmp_path, built)
    base = ["census", "--site-packages", str(site), "--arch", "sm_120", "--arch", "sm_121", "--no-torch"]
    text = _run(tmp_path, *base)
    assert text.returncode == 1, text.stderr  # torch cannot run on sm_121
    assert "census: 2 distributions with CUDA code" in text.stdout
    assert "torch 2.9.0 on sm_121: torch/lib/libtorch_cuda.so have no image for sm_121" in text.stdout
    assert f"you will see: {NO_IMAGE}" in text.stdout
    assert "sglang" not in text.stdout.lower() and not text.stderr
    js = _run(tmp_path, *base, "--json")
    assert js.returncode == 1
    report = json.loads(js.stdout)
    rows = {r["name"]: r["gpus"] for r in report["census"]["distributions"]}
    assert {n: {a: g["status"] for a, g in gpus.items()} for n, gpus in rows.items()} == {
        "tiny": {"sm_120": "ok", "sm_121": "ok"},
        "torch": {"sm_120": "ok", "sm_121": "none"},
    }
    assert report["machine"]["archs"] == ["sm_120", "sm_121"]
    md = _run(tmp_path, *base, "--markdown")
    assert md.returncode == 1
    lines = md.stdout.splitlines()
    assert lines[0] == "### Environment (sm120patch census)"
    assert "| driver | - |" in lines and "| torch | not asked |" in lines
    assert "| distribution | version | sm_120 | sm_121 | SASS / PTX / LTO |" in lines
    assert "| torch | 2.9.0 | ok | NO | sm_120a / - / - |" in lines
    assert "| tiny | 1.0 | ok | ok | sm_120 / - / - |" in lines
    assert any(ln.startswith("- torch 2.9.0 on sm_121: torch/lib/libtorch_cuda.so (") for ln in lines)


def test_census_exits_0_when_everything_runs(tmp_path: Path, built: Path) -> None:
    site = _site(tmp_path, built, torch_file="sm_120.so")
    r = _run(tmp_path, "census", "--site-packages", str(site), "--arch", "sm_121", "--no-torch")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--python", "/nonexistent/bin/python"], "--python /nonexistent/bin/python: no such file"),
        (["--python", sys.executable, "--site-packages", "."], "not both"),
        (["--json", "--markdown"], "--json or --markdown, not both"),
        (["--arch", "sm_1x"], "not an architecture"),
    ],
)
def test_census_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    r = _run(tmp_path, "census", "--no-torch", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_preflight_without_sglang_answers_and_takes_the_census_into_its_exit(tmp_path: Path, built: Path) -> None:
    """README's `sm120patch preflight` right after `pip install .`, and `preflight --site-packages
    DIR` / `--python VENV`: no SGLang there; the machine report and the census still answer."""
    site = _site(tmp_path, built)
    common = ["--arch", "sm_121", "--no-torch", "--probe", "none"]
    r = _run(tmp_path, "preflight", "--site-packages", str(site), *common)
    assert r.returncode == 1, r.stdout + r.stderr  # torch cannot run on sm_121: every server start fails
    assert "sglang: not found (" in r.stdout and "the machine and census still answer" in r.stdout
    assert "recipes: none planned" in r.stdout
    assert f"census: torch 2.9.0 cannot run on sm_121 (none): {NO_IMAGE} (preflight exits 1)" in r.stdout
    js = json.loads(_run(tmp_path, "preflight", "--site-packages", str(site), *common, "--json").stdout)
    assert js["recipes"] == [] and js["sglang_missing"] and js["census_fails"]
    # tiny (not a package a server loads) does not count; a torch that runs: exit 0
    ok_site = _site(tmp_path / "ok", built, torch_file="sm_120.so")
    assert _run(tmp_path, "preflight", "--site-packages", str(ok_site), *common).returncode == 0
    # this interpreter's own environment (the tool's venv: no SGLang), as after `pip install .`
    for extra in ([], ["--python", sys.executable]):
        p = _run(tmp_path, "preflight", *extra, *common)
        assert p.returncode in (0, 1) and "sglang: not found" in p.stdout, p.stdout + p.stderr
        assert "census:" in p.stdout
    # a --python that does not run stays a usage error
    bad = _run(tmp_path, "preflight", "--python", str(tmp_path / "nope"), *common)
    assert bad.returncode == 2 and "sglang: not found" not in bad.stdout
