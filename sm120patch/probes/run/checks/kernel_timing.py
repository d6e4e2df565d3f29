"""Time a candidate kernel against the path it replaces, in every rank of a run check.

Imported by check scripts (harness.py runs from this folder, so `import kernel_timing` finds
it), never by the tool. Each contender is called `inner` times per sample; samples of the
contenders alternate in a rotating order (a box that slows down mid-run slows them all) and
begin on every rank together (a barrier); each sample is the slowest rank's, since a
collective is done only when its last rank is. A Timer says how a sample is read: CUDA events
on the GPU, perf_counter on CPU (the unit tests, with fakes over gloo). The result is a median
and a spread per contender, and the candidate's time over the baseline's per paired sample.
"""

import shutil
import subprocess
import time


class WallTimer:
    """perf_counter around `inner` calls: for CPU fakes, where the call is the work."""

    name = "perf_counter"

    def sample(self, fn, inner):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - start) * 1e3 / inner


class CudaEventTimer:
    """CUDA events on the current stream around `inner` calls: GPU time, launches queued behind
    each other as an eager forward pass queues them (no CUDA graph)."""

    name = "cuda-events"

    def __init__(self, device):
        import torch

        self.torch, self.device = torch, device

    def sample(self, fn, inner):
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / inner


class Group:
    """The collectives timing needs on the check's process group: a barrier and a max/min over ranks."""

    def __init__(self, group, device=None):
        import torch

        self.torch, self.group, self.device = torch, group, device

    def _reduce(self, values, op):
        import torch.distributed as dist

        t = self.torch.tensor(values, dtype=self.torch.float64, device=self.device)
        if self.group is not None:
            dist.all_reduce(t, op=op, group=self.group)
        return [float(v) for v in t.cpu().tolist()]

    def sync(self):
        if self.device is not None:
            self.torch.cuda.synchronize(self.device)
        self.max([0.0])
        if self.device is not None:
            self.torch.cuda.synchronize(self.device)

    def max(self, values):
        import torch.distributed as dist

        return self._reduce(values, dist.ReduceOp.MAX)

    def min(self, values):
        import torch.distributed as dist

        return self._reduce(values, dist.ReduceOp.MIN)


def quantile(xs, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    if not s:
        return None
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def stats(xs):
    """Median and spread of samples (ms)."""
    return {
        "median": round(quantile(xs, 0.5), 6),
        "q1": round(quantile(xs, 0.25), 6),
        "q3": round(quantile(xs, 0.75), 6),
        "min": round(min(xs), 6),
        "max": round(max(xs), 6),
        "n": len(xs),
    }


def measure(contenders, group, timer, warmup=3, repeats=20, inner=10):
    """Samples (ms per call, the slowest rank's) of each contender {name: fn}; every rank calls
    this with the same contenders in the same order, so collectives inside them line up."""
    names = list(contenders)
    for name in names:
        for _ in range(warmup):
            contenders[name]()
    own = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            group.sync()
            own[name].append(timer.sample(contenders[name], inner))
    flat = group.max([x for name in names for x in own[name]])
    return {name: flat[i * repeats : (i + 1) * repeats] for i, name in enumerate(names)}


def side(ratio_q1, ratio_q3):
    """Where the candidate stands when its paired ratios' spread is taken into account."""
    if ratio_q1 > 1.0:
        return "slower"
    if ratio_q3 < 1.0:
        return "faster"
    return "level"


def compare(samples, candidate, baseline):
    """One row: the candidate's and the baseline's times, and candidate/baseline per paired sample."""
    cand, base = samples[candidate], samples[baseline]
    paired = [cand[i] / base[i] for i in range(min(len(cand), len(base))) if base[i] > 0]
    cs, bs = stats(cand), stats(base)
    q1, q3 = quantile(paired, 0.25), quantile(paired, 0.75)
    return {
        "candidate": candidate,
        "baseline": baseline,
        "candidate_ms": cs,
        "baseline_ms": bs,
        "ratio": round(cs["median"] / bs["median"], 4) if bs["median"] > 0 else None,
        "ratio_q1": round(q1, 4) if q1 is not None else None,
        "ratio_q3": round(q3, 4) if q3 is not None else None,
        "side": side(q1, q3) if q1 is not None else "level",
    }


def _topo_cell(text, a, b):
    """The link between GPU a and GPU b in `nvidia-smi topo -m` (NV18, PIX, PHB, NODE, SYS...)."""
    header = None
    for line in text.splitlines():
        cols = line.split()
        if header is None and cols and cols[0].startswith("GPU"):
            header = cols
            continue
        if header is not None and cols and cols[0] == f"GPU{a}" and f"GPU{b}" in header:
            idx = header.index(f"GPU{b}") + 1  # rows carry their own label in front
            return cols[idx] if idx < len(cols) else None
    return None


def topology(devices):
    """How the ranks' GPUs reach each other: P2P access as CUDA reports it and nvidia-smi's matrix."""
    import os

    import torch

    out = {"devices": list(devices), "p2p": {}, "links": {}}
    for a in devices:
        for b in devices:
            if a != b:
                out["p2p"][f"{a}->{b}"] = bool(torch.cuda.can_device_access_peer(a, b))
    smi = shutil.which("nvidia-smi")
    if smi is None:
        out["nvidia_smi"] = "not found"
        return out
    try:
        p = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=30)
        text = p.stdout if p.returncode == 0 else p.stderr
    except (OSError, subprocess.SubprocessError) as e:
        out["nvidia_smi"] = f"failed: {e}"
        return out
    out["nvidia_smi_topo"] = text[-4000:]
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        out["links_note"] = "CUDA_VISIBLE_DEVICES is set: torch's indices may not be nvidia-smi's"
        return out
    for i, a in enumerate(devices):
        for b in devices[i + 1 :]:
            out["links"][f"{a}-{b}"] = _topo_cell(text, a, b)
    return out
