"""A torch-free fake check for the driver's own tests (sys.executable is enough to run it).

PLAIN_RUN: ok, hang (rank 1 sleeps in the kernel and so does its child process), exit (rank 0
exits 3 in the kernel without a word), stdout-noise (prints non-JSON lines first).
"""

import os
import subprocess
import sys
import time

BACKEND = None
MODE = os.environ.get("PLAIN_RUN", "ok")


def devices():
    return [{"index": 0, "name": "Plain", "capability": [9, 0]}, {"index": 1, "name": "Plain", "capability": [9, 0]}]


def prepare(ctx):
    return {}


def run_rank(ctx):
    if MODE == "stdout-noise":
        print("a library talking on stdout", flush=True)
        print("[1, 2, 3]", flush=True)
    ctx.phase("kernel", case="plain")
    if MODE == "hang" and ctx.rank == 1:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(os.environ["PLAIN_PIDFILE"], "w") as f:
            f.write(f"{os.getpid()} {child.pid}\n")
        time.sleep(3600)
    if MODE == "exit" and ctx.rank == 0:
        os._exit(3)
    return {
        "api": "plain",
        "cases": [
            {
                "name": "plain",
                "ok": True,
                "numel": 1,
                "n_bad": 0,
                "max_abs_err": 0.0,
                "atol": 0.0,
                "rtol": 0.0,
                "shape": [1],
                "dtype": "none",
            }
        ],
        "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "CUDA_DEVICE_ORDER")},
    }
