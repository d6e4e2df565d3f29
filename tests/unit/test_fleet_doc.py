"""docs/fleet.md, run: the export command, every RUN line of its Dockerfiles and the init
container's command, against a fake site-packages on PYTHONPATH (what an image's Python imports).

Docker and Kubernetes need not be here: the commands are taken from the page as written (only
the image's paths are mapped to temporary folders), run with /bin/sh like Docker's shell form,
and the pod spec is parsed as YAML and checked for the shape the page promises. GPUs on the
"node" come from a fake `nvidia-smi` on PATH, the way sm120patch finds them on a real one.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.unit.sglang_fakes import COMMUNICATOR_REL, MODEL_RUNNER_REL, SERVER_ARGS_REL, snapshot
from tests.unit.test_bundle import ALLREDUCE, install_flashinfer, make_site, recipes_dir

DOC = Path(__file__).resolve().parents[2] / "docs" / "fleet.md"
H100 = "NVIDIA H100 80GB HBM3, 9.0, 580.65.06"
PRO6000 = "NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0, 580.65.06"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def dockerfile(text: str) -> tuple[dict[str, str], list[str]]:
    """(COPY destination -> source, RUN commands), continuation lines joined."""
    joined = re.sub(r"\\\n\s*", "", text)
    copies, runs = {}, []
    for line in joined.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "COPY":
            src, dst = rest.split()
            copies[dst.rstrip("/")] = src.rstrip("/")
        elif word == "RUN":
            runs.append(rest)
    return copies, runs


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The image's environment: its Python imports the fake site; sm120patch and python3 on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    recipes = recipes_dir(tmp_path / "recipes")
    return {
        "HOME": str(tmp_path / "home"),
        "PATH": f"{bindir}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "PYTHONPATH": str(tmp_path / "image-site"),
        "SM120PATCH_RECIPES": str(recipes),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "fi-home"),
    }


def gpus(env: dict[str, str], *lines: str) -> None:
    """What `nvidia-smi --query-gpu=name,compute_cap,driver_version` says on this node."""
    smi = Path(env["PATH"].split(":")[0]) / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo {shlex.quote(line)}\n" for line in lines))
    smi.chmod(0o755)


def sh(command: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-c", command], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


GATES = """
import json
from sglang.srt.layers.communicator import apply_flashinfer_allreduce_fusion
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs
from types import SimpleNamespace

runner = ModelRunner()
runner.server_args = SimpleNamespace(moe_runner_backend="flashinfer_cutlass")
args, tp4 = ServerArgs(), ServerArgs()
args.tp_size, tp4.tp_size = 2, 4  # SM12x auto-enables the fusion only below TP 4 (sglang PR 32330)
args._handle_model_specific_adjustments()
tp4._handle_model_specific_adjustments()
print(json.dumps({
    "allreduce_fusion": bool(apply_flashinfer_allreduce_fusion(16)),
    "autotune_flashinfer_cutlass": bool(runner._should_run_flashinfer_autotune()),
    "fusion_auto_enabled": bool(getattr(args, "enable_flashinfer_allreduce_fusion", False)),
    "fusion_auto_enabled_tp4": bool(getattr(tp4, "enable_flashinfer_allreduce_fusion", False)),
}))
"""
SHUT = {k: False for k in ("allreduce_fusion", "autotune_flashinfer_cutlass", "fusion_auto_enabled")}
SHUT["fusion_auto_enabled_tp4"] = False
OPEN = {**{k: True for k in SHUT}, "fusion_auto_enabled_tp4": False}


def gates_answer(site: Path) -> dict[str, bool]:
    """The fake SGLang's own gates, imported from `site` and asked on the SM120 box its utils model."""
    r = subprocess.run(
        [sys.executable, "-c", GATES], env={"PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_page_has_what_the_test_runs() -> None:
    assert len(blocks("dockerfile")) == 2 and len(blocks("yaml")) == 1
    assert any("sm120patch export" in b for b in blocks("bash"))


def test_export_dockerfile_and_init_container_as_written(tmp_path: Path, env: dict[str, str]) -> None:
    image = make_site(tmp_path / "image-site")
    pristine = snapshot(image)
    work = tmp_path / "work"
    work.mkdir()

    # 1. export, inside the release image (no GPU: --arch)
    (export_block,) = [b for b in blocks("bash") if "sm120patch export" in b]
    exports = [line for line in export_block.splitlines() if line.startswith("sm120patch ")]
    assert exports == ["sm120patch export --installed --arch sm_120 -o bundle"]
    r = sh(exports[0], env, work)
    assert r.returncode == 0, r.stdout + r.stderr
    assert snapshot(image) == pristine  # export wrote nothing
    bundle = work / "bundle"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["probe_level"] == "spec" and {x["status"] for x in manifest["recipes"]} == {"exported"}

    # the oracle: what the gates of the fake SGLang answer on the SM120 box it models (its utils say
    # is_sm120_supported() and nothing older), run in the image's Python: shut before, open after
    assert gates_answer(image) == SHUT

    # 2. the Dockerfile: every RUN line but the pip install of sm120patch itself, in /bin/sh
    copies, runs = dockerfile(blocks("dockerfile")[0])
    assert copies == {"/opt/sm120patch/src": "sm120patch", "/opt/sm120patch/bundle": "bundle"}
    assert runs[0] == "python3 -m pip install --no-cache-dir /opt/sm120patch/src"
    for run in runs[1:]:
        assert run.startswith("sm120patch ") and "--arch sm_120" in run  # no GPU during docker build
        r = sh(run.replace("/opt/sm120patch/bundle", str(bundle)), env, work)
        assert r.returncode == 0, r.stdout + r.stderr
    assert gates_answer(image) == OPEN and (image / ".sm120patch" / "journal.json").is_file()
    after = snapshot(image)
    changed = {rel for rel in after if after[rel] != pristine.get(rel)}
    assert changed == {COMMUNICATOR_REL, SERVER_ARGS_REL, MODEL_RUNNER_REL} | {
        rel for rel in after if rel.startswith(".sm120patch/")
    }
    expected = {rel: data for rel, data in after.items() if not rel.startswith(".sm120patch/")}

    # the variant without sm120patch in the image gives the same bytes
    env2 = {**env, "PYTHONPATH": str(make_site(tmp_path / "plain-site"))}
    copies2, runs2 = dockerfile(blocks("dockerfile")[1])
    assert copies2 == {"/opt/sm120patch/bundle": "bundle"}
    for run in runs2:
        r = sh(run.replace("/opt/sm120patch/bundle", str(bundle)), env2, work)
        assert r.returncode == 0, r.stdout + r.stderr
    assert snapshot(tmp_path / "plain-site") == expected and gates_answer(tmp_path / "plain-site") == OPEN

    # 3. the pod: same image, a shared volume, the init container's command
    pod = yaml.safe_load(blocks("yaml")[0])
    assert pod["apiVersion"] == "v1" and pod["kind"] == "Pod"
    spec = pod["spec"]
    (init,) = spec["initContainers"]
    (server,) = spec["containers"]
    assert init["image"] == server["image"]
    assert init["command"][:4] == ["sm120patch", "preflight", "--bundle", "/opt/sm120patch/bundle"]
    assert "--arch" not in init["command"]  # on the node, the node's GPUs decide
    assert init["resources"]["limits"]["nvidia.com/gpu"] == server["resources"]["limits"]["nvidia.com/gpu"]
    (volume,) = spec["volumes"]
    assert "emptyDir" in volume
    mounts = {c["name"]: {m["name"]: m["mountPath"] for m in c["volumeMounts"]} for c in (init, server)}
    assert mounts[init["name"]][volume["name"]] == mounts[server["name"]][volume["name"]] == "/var/run/sm120patch"
    report_at = init["command"][init["command"].index("--report") + 1]
    assert report_at.startswith("/var/run/sm120patch/")
    assert server["command"][:3] == ["python3", "-m", "sglang.launch_server"]

    shared = tmp_path / "shared"
    command = [
        a.replace("/opt/sm120patch/bundle", str(bundle)).replace("/var/run/sm120patch", str(shared))
        for a in init["command"]
    ]
    node = {**env}
    gpus(node, PRO6000, PRO6000)
    r = subprocess.run(command, env=node, cwd=work, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((shared / Path(report_at).name).read_text())
    assert report["ok"] and report["arch_source"] == "detected" and report["archs"] == ["sm_120"]
    assert report["probe_level"] == "spec" and {x["state"] for x in report["recipes"]} == {"ok"}

    # another GPU: exit 1, the recipe and the command that takes it back
    gpus(node, H100)
    r = subprocess.run(command, env=node, cwd=work, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "this node has sm_90" in r.stdout
    assert f"sm120patch rollback {image.resolve()} --recipe {ALLREDUCE}" in r.stdout

    # a FlashInfer swapped under the image: exit 1 for the recipe whose kernels are gone
    gpus(node, PRO6000)
    install_flashinfer(image, gate="[9, 10]", version="0.6.16")
    r = subprocess.run(command, env=node, cwd=work, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout
    report = json.loads((shared / Path(report_at).name).read_text())
    ar = {x["id"]: x for x in report["recipes"]}[ALLREDUCE]
    assert ar["state"] == "mismatch" and "[9, 10]" in ar["reason"] and "0.6.17 -> 0.6.16" in ar["reason"]
