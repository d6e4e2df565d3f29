"""Spec rung: ask FlashInfer itself whether it would build the module for the arch.

Calls the JIT generator in a subprocess of the target Python with
FLASHINFER_CUDA_ARCH_LIST set to the arch. The generator either returns a JitSpec or
raises FlashInfer's own "No supported CUDA architectures found for major versions
[...]", the exact error a server would hit. No GPU and no nvcc are needed.

Importing torch and FlashInfer costs seconds, so every question a command has for one arch
goes to one interpreter (`ask`; one per arch, since FlashInfer reads the arch list when it
is imported, and the archs' interpreters run side by side). A check that crashes or hangs
that interpreter is reported as that check's, and the checks after it get a fresh one. Each
answer is kept with the signature of every Python file the interpreter had loaded (sha256
for FlashInfer's own, size and mtime for the rest): while none changed, the answer is read
back without starting an interpreter (the build rung's compile commands too).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120patch.arch import Arch
from sm120patch.catalogue.kernels import Kernel
from sm120patch.probes.environment.device import CudaToolkit, can_build_for, find_cuda
from sm120patch.probes.environment.flashinfer import FlashInferEnv
from sm120patch.probes.rungs import Step
from sm120patch.probes.subproc import child_env, kill_live, own_dir, run_script
from sm120patch.probes.verdict_cache import AnswerCache, ProbeCache, default_cache_dir, forget_digests

TIMEOUT_S = 120.0  # one interpreter: the imports and every generator call asked of it
NO_ARCH = "No supported CUDA architectures found"
MISSING_DEPS = ("torch", "flashinfer", "tvm_ffi")
Group = tuple  # (arch, commands, CUDA home, family): the questions one interpreter gets
ENV_KEYS = ("FLASHINFER_CUDA_ARCH_LIST", "CUDA_HOME", "CUDA_PATH", "PYTHONPATH")

SCRIPT = r"""
import importlib, json, os, shlex, sys
def emit(o):
    sys.stdout.write(json.dumps(o) + "\n"); sys.stdout.flush()
for r in json.loads(sys.argv[1]):
    emit({"start": r["id"]})
    out = {"id": r["id"]}
    try:
        m = importlib.import_module(r["module"])
        out["file"] = getattr(m, "__file__", None)
    except BaseException as e:
        out.update(stage="import", error=f"{type(e).__name__}: {e}", missing=getattr(e, "name", None))
    else:
        fn = getattr(m, r["generator"], None)
        if fn is None:
            out.update(stage="lookup", error=f"{r['module']} has no {r['generator']}")
        else:
            try:
                spec = fn(**r["kwargs"])
                out.update(ok=True, type=type(spec).__name__, name=getattr(spec, "name", None))
            except BaseException as e:
                out.update(stage="call", error=f"{type(e).__name__}: {e}")
            else:
                if r["commands"]:
                    try:
                        cmds = spec.get_compile_commands()
                        out["commands"] = [{"file": c["file"], "argv": shlex.split(c["command"])} for c in cmds]
                    except BaseException as e:
                        out["commands_error"] = f"{type(e).__name__}: {e}"
    emit({"answer": out})
files = set()
for m in list(sys.modules.values()):
    f = getattr(m, "__file__", None)
    if isinstance(f, str) and os.path.isfile(f):
        files.add(os.path.realpath(f))
emit({"files": sorted(files)})
"""


@dataclass(frozen=True)
class Ask:
    """One question for a generator: does it accept `arch`, and (for the build rung) with which
    compile commands, for the toolkit at `cuda_home` and SM 12.0's family target or not."""

    kernel: Kernel
    arch: Arch
    commands: bool = False
    cuda_home: str | None = None
    family: bool = True


def toolchain(arch: Arch, cuda: CudaToolkit | None = None) -> tuple[CudaToolkit, bool]:
    """The CUDA toolkit the build rung compiles with, and whether SM 12.0 gets its family target
    (12.0f needs CUDA >= 12.9; else 12.0a, as FlashInfer itself picks)."""
    cuda = cuda if cuda is not None else find_cuda()
    family = arch.major == 12 and arch.minor == 0
    return cuda, (not family) or cuda.version is None or can_build_for(cuda, arch, family=True)[0]


def build_ask(kernel: Kernel, arch: Arch, cuda: CudaToolkit | None = None) -> Ask:
    """The question the build rung asks (and the spec rung, when the build rung comes next)."""
    cuda, family = toolchain(arch, cuda)
    return Ask(kernel, arch, True, cuda.home, family)


def generator_env(a: Ask, fi: FlashInferEnv, workspace: str) -> dict[str, str]:
    sys_path = str(fi.sys_path) if fi.source == "tree" and fi.sys_path else None
    env = child_env(a.arch, sys_path, workspace, a.family)
    if a.cuda_home:
        env["CUDA_HOME"] = a.cuda_home
    return env


def _answer_key(a: Ask, fi: FlashInferEnv, env: dict[str, str]) -> str:
    python = Path(fi.python or "")
    try:  # a venv's python is a link: the venv (its site-packages) and the binary both count
        st = python.resolve().stat()
        interp = f"{python}|{python.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        interp = str(python)
    cuda_bin = str(Path(env["CUDA_HOME"]) / "bin") if env.get("CUDA_HOME") else None
    nvcc = shutil.which("nvcc", path=os.pathsep.join(filter(None, [cuda_bin, env.get("PATH")])))
    return ProbeCache.key(
        {
            "answer": 2,
            "module": a.kernel.module,
            "generator": a.kernel.generator,
            "kwargs": dict(a.kernel.generator_kwargs),
            "commands": a.commands,
            "python": interp,
            "location": fi.location,
            "sys_path": str(fi.sys_path),
            "env": {k: env.get(k) for k in ENV_KEYS},
            "nvcc": [nvcc, os.path.getmtime(nvcc) if nvcc else None],
        }
    )


def _ask_one_interpreter(
    asks: list[tuple[str, Ask]], fi: FlashInferEnv, env: dict[str, str], timeout: float
) -> tuple[dict[str, dict[str, Any]], list[str] | None]:
    """Every question under one interpreter; a crash or hang is the check's that was running, and
    the questions after it go to a fresh interpreter. Returns the answers and the files loaded
    (None unless every interpreter finished cleanly: then nothing is cached)."""
    answers: dict[str, dict[str, Any]] = {}
    files: set[str] | None = set()
    todo = list(asks)
    while todo:
        reqs = [
            {
                "id": key,
                "module": a.kernel.module,
                "generator": a.kernel.generator,
                "kwargs": dict(a.kernel.generator_kwargs),
                "commands": a.commands,
            }
            for key, a in todo
        ]
        assert fi.python is not None
        res = run_script(fi.python, SCRIPT, [json.dumps(reqs)], env, timeout)
        started = None
        for line in res.lines:
            if "start" in line:
                started = line["start"]
            elif "answer" in line and isinstance(line["answer"], dict):
                answers[str(line["answer"].get("id"))] = {**line["answer"], "elapsed_s": round(res.elapsed_s, 2)}
                started = None
            elif "files" in line and files is not None and isinstance(line["files"], list):
                files.update(str(f) for f in line["files"])
        if all(k in answers for k, _ in todo) and not res.timed_out:
            break  # (two kernels may share a generator, hence a key: count keys, not questions)
        files = None  # this interpreter did not finish: its answers are not kept
        culprit = started if started is not None else next((k for k, _ in todo if k not in answers), None)
        if culprit is not None and culprit not in answers:
            if res.timed_out:
                how = {"stage": "timeout", "error": f"did not finish within {timeout:.0f} s"}
            else:
                tail = res.stderr_tail.strip().splitlines()
                how = {
                    "stage": "crash",
                    "error": f"{fi.python} exited {res.returncode} while asking it"
                    + (f": {' | '.join(tail[-2:])[-300:]}" if tail else ""),
                }
            answers[culprit] = {"id": culprit, **how}
        todo = [(k, a) for k, a in todo if k not in answers]
    return answers, (sorted(files) if files is not None else None)


def ask(asks: Sequence[Ask], fi: FlashInferEnv, cache_root: Path | None = None,
        timeout: float = TIMEOUT_S, use_cache: bool = True) -> dict[Ask, dict[str, Any]]:  # fmt: skip
    """The generator's answer to every question: from the answer cache where nothing it stood on
    changed, else from one interpreter per arch (those run side by side)."""
    forget_digests()
    cache = AnswerCache(cache_root if cache_root is not None else default_cache_dir())
    hashed_under = fi.package_dir.resolve() if fi.package_dir else None
    out: dict[Ask, dict[str, Any]] = {}
    if not fi.python:
        return out
    groups: dict[Group, list[tuple[str, Ask]]] = {}
    envs: dict[Group, dict[str, str]] = {}
    with own_dir("spec") as ws:
        for a in dict.fromkeys(asks):
            group = (a.arch.name, a.commands, a.cuda_home, a.family)
            env = envs.setdefault(group, generator_env(a, fi, str(ws)))
            key = _answer_key(a, fi, env)
            if use_cache and (hit := cache.get(key, hashed_under)) is not None:
                out[a] = {**hit, "cached": True}
            else:
                groups.setdefault(group, []).append((key, a))
        results: dict[Group, tuple[dict[str, dict[str, Any]], list[str] | None]] = {}

        errors: list[BaseException] = []

        def run(group: Group) -> None:
            try:
                results[group] = _ask_one_interpreter(groups[group], fi, envs[group], timeout)
            except BaseException as e:  # re-raised below, in the caller's thread
                errors.append(e)

        if len(groups) == 1:
            run(next(iter(groups)))
        else:  # the archs' interpreters side by side; Ctrl-C here ends every one of them
            threads = [threading.Thread(target=run, args=(g,), daemon=True) for g in groups]
            try:
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            except BaseException:
                kill_live()
                raise
        if errors:
            raise errors[0]
    for group, todo in groups.items():
        answers, files = results.get(group, ({}, None))
        for key, a in todo:
            answer = answers.get(key) or {"id": key, "stage": "crash", "error": "no answer"}
            out[a] = answer
            if files is not None and answer.get("stage") not in ("crash", "timeout"):
                cache.put(key, answer, files, hashed_under)
    return out


_UNCACHED: dict[tuple[Ask, str | None, str | None], dict[str, Any]] = {}


def prefetch(asks: Sequence[Ask], fi: FlashInferEnv, cache_root: Path | None = None) -> None:
    """Ask every question a command will have at once (one interpreter per arch, not per check).
    The answers land in the answer cache, where `check_spec` finds them (validated again); a
    crash or a hang, which is never cached, is kept here for the one check it belongs to."""
    if fi.python and asks:
        for a, answer in ask(asks, fi, cache_root).items():
            if answer.get("stage") in ("crash", "timeout"):
                _UNCACHED[(a, fi.python, fi.location)] = answer


def answer_for(a: Ask, fi: FlashInferEnv, cache_root: Path | None = None) -> dict[str, Any]:
    """This question's answer: a prefetched crash (taken once), the answer cache, or asked now."""
    if (hit := _UNCACHED.pop((a, fi.python, fi.location), None)) is not None:
        return hit
    return ask([a], fi, cache_root).get(a) or {"stage": "crash", "error": "no answer"}


def check_spec(kernel: Kernel, arch: Arch, fi: FlashInferEnv, timeout: float = TIMEOUT_S, commands: bool = False,
               cache_root: Path | None = None) -> Step:  # fmt: skip
    """(result, reason) of calling the generator for `arch` under `fi.python`; with `commands`, the
    question the build rung will ask (so the two share one answer)."""
    if not fi.python:
        return Step(
            "unknown",
            "spec: no Python interpreter to run this FlashInfer tree under"
            ": pass --python EXE (the server's Python, with torch)",
        )
    a = build_ask(kernel, arch) if commands else Ask(kernel, arch)
    p = (
        answer_for(a, fi, cache_root)
        if timeout == TIMEOUT_S
        else ask([a], fi, cache_root, timeout).get(a) or {"stage": "crash", "error": "no answer"}
    )
    arch_list = generator_env(a, fi, "")["FLASHINFER_CUDA_ARCH_LIST"]
    where = f"{kernel.module}.{kernel.generator}() with FLASHINFER_CUDA_ARCH_LIST={arch_list}"
    took = "from cache" if p.get("cached") else f"{p.get('elapsed_s', 0.0):.1f} s"
    if p.get("stage") == "timeout":
        return Step("unknown", f"spec: {where} {p.get('error')}")
    if p.get("stage") == "crash":
        return Step("unknown", f"spec: {where}: {p.get('error')}")
    if p.get("ok"):
        return Step("pass", f"spec: {where} returned a {p.get('type')} ({took})")
    err = str(p.get("error", ""))
    if p.get("stage") == "call" and NO_ARCH in err:
        return Step("fail", f"spec: {where} raised {err}")
    if p.get("stage") == "import":
        missing = p.get("missing")
        if missing and str(missing).split(".")[0] in MISSING_DEPS:
            return Step("unknown", f"spec: {fi.python} cannot import {missing} ({err})")
        return Step("unknown", f"spec: importing {kernel.module} under {fi.python} failed: {err}")
    if p.get("stage") == "lookup":
        return Step("unknown", f"spec: {err} (this FlashInfer has no such generator)")
    return Step("unknown", f"spec: {where} raised {err}")
