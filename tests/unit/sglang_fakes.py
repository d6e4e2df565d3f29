"""Small fake SGLang trees for unit tests: the *shape* of the gates the real recipes open.

Nothing here is SGLang code; each module holds just enough structure (a module-level
arch flag, a from-import, an `or` of arch predicates, a commented-out list item, a
MoE config method) for the three catalogue recipes to find their sites.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

COMMUNICATOR = """\
from sglang.srt.utils import (
    is_cuda,
    is_sm90_supported,
    is_sm100_supported,
)

_is_cuda = is_cuda()
_is_sm90_supported = _is_cuda and is_sm90_supported()
_is_sm100_supported = _is_cuda and is_sm100_supported()


def apply_flashinfer_allreduce_fusion(batch_size: int) -> bool:
    return (
        (_is_sm90_supported or _is_sm100_supported)
        and batch_size > 0
        and batch_size <= 4096
    )
"""

SERVER_ARGS = '''\
import logging

from sglang.srt.utils import is_sm90_supported, is_sm100_supported

logger = logging.getLogger(__name__)


class ServerArgs:
    def _handle_model_specific_adjustments(self):
        if is_sm90_supported() or is_sm100_supported():
            self.enable_flashinfer_allreduce_fusion = True

    def _handle_moe_kernel_config(self):
        """Choose the MoE runner backend."""
        if self.quantization == "fp8" and is_sm100_supported():
            self.moe_runner_backend = "flashinfer_trtllm"
'''

MODEL_RUNNER = """\
class ModelRunner:
    def _should_run_flashinfer_autotune(self) -> bool:
        backend = self.server_args.moe_runner_backend
        return backend in [
            "flashinfer_trtllm",
            # TODO: flashinfer_cutlass will cause some flashinfer compilation errors.
            # "flashinfer_cutlass",
            "flashinfer_mxfp4",
        ]
"""

UTILS = """\
def is_cuda():
    return True


def is_sm90_supported():
    return False


def is_sm100_supported():
    return False


def is_sm120_supported():
    return True
"""

ALLREDUCE = "sglang-allreduce-fusion-sm120"
AUTOTUNE = "sglang-autotune-flashinfer-cutlass"
MOE = "sglang-moe-backend-sm120"
ALL_IDS = (ALLREDUCE, AUTOTUNE, MOE)

COMMUNICATOR_REL = "sglang/srt/layers/communicator.py"
SERVER_ARGS_REL = "sglang/srt/server_args.py"
MODEL_RUNNER_REL = "sglang/srt/model_executor/model_runner.py"


def make_sglang(parent: Path, version: str = "0.5.9", *, runner_final_newline: bool = True) -> Path:
    """Write a fake `sglang` package under `parent`; returns the package folder."""
    pkg = parent / "sglang"
    files = {
        "__init__.py": "",
        "version.py": f'__version__ = "{version}"\n',
        "srt/__init__.py": "",
        "srt/utils.py": UTILS,
        "srt/layers/__init__.py": "",
        "srt/layers/communicator.py": COMMUNICATOR,
        "srt/server_args.py": SERVER_ARGS,
        "srt/model_executor/__init__.py": "",
        "srt/model_executor/model_runner.py": MODEL_RUNNER if runner_final_newline else MODEL_RUNNER.rstrip("\n"),
    }
    for rel, text in files.items():
        p = pkg / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return pkg


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file's bytes under `root`, except git's and sm120patch's own folders."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if rel.parts[0] in (".git", ".sm120patch") or "__pycache__" in rel.parts or not p.is_file():
            continue
        out[rel.as_posix()] = p.read_bytes()
    return out


GIT_ENV = {
    "GIT_AUTHOR_NAME": "sm120patch tests",
    "GIT_AUTHOR_EMAIL": "tests@example.invalid",
    "GIT_COMMITTER_NAME": "sm120patch tests",
    "GIT_COMMITTER_EMAIL": "tests@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(cwd: Path, *args: str) -> str:
    """Run git in `cwd` with a fixed identity; returns stdout, raises on failure."""
    env = {**os.environ, **GIT_ENV}
    r = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {r.stderr}")
    return r.stdout


def make_clone(root: Path, version: str | None = "0.5.9", tag: str | None = None) -> Path:
    """A git repository laid out like an SGLang clone (python/sglang/), one commit; returns its root."""
    root.mkdir(parents=True, exist_ok=True)
    pkg = make_sglang(root / "python", version or "0.0.0")
    if version is None:
        (pkg / "version.py").unlink()
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    if tag:
        git(root, "tag", tag)
    return root
