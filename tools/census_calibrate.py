"""Calibrate the census against a real GPU: what each library carries, and whether it runs.

Run on a machine with an NVIDIA GPU, in the Python environment to be judged:

    python3 tools/census_calibrate.py --out census-calibration.json

For every installed distribution that carries CUDA code it records

- what its files carry, read by a fatbin walker of this script's own (not the census's
  reader, so that the record can be the census's oracle): per container, each entry's raw
  header fields (kind number, SM, flags, PTX/IR version), deduplicated into signatures with
  counts; and, where `cuobjdump` exists, its own listing counted per architecture;
- one real operation per distribution, each in its own subprocess with a timeout (the
  operation is named in the record: a matmul through cuBLAS, a convolution through cuDNN,
  an FFT through cuFFT, ...), and whether it ran, with the error's last line if not;
- what the census of the sm120patch tree beside this script said, for the GPU present and
  for sm_120 / sm_121, so the record holds "what we said" beside "what happened".

A distribution with no operation here is recorded as `not exercised`, never as passing.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import struct
import subprocess
import sys
import sysconfig
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
FATBIN_MAGIC = 0xBA55ED50
ELF_MAGIC = b"\x7fELF"

# One operation per distribution: Python source run in a fresh interpreter. Each prints "OK"
# on success; anything else (an exception, a crash, a time-out) is a failure.
OPS: dict[str, tuple[str, str]] = {
    "torch": (
        "elementwise, softmax and a reduction on the GPU",
        "import torch; x=torch.randn(1024,1024,device='cuda'); y=(x*2+1).softmax(-1).sum(); "
        "torch.cuda.synchronize(); assert torch.isfinite(y); print('OK')",
    ),
    "nvidia-cublas": (
        "bf16 and fp32 matmul (cuBLAS), fp8 scaled matmul (cuBLASLt)",
        "import torch; a=torch.randn(512,512,device='cuda'); "
        "r=(a@a); b=a.bfloat16(); rb=(b@b).float(); "
        "assert (rb-r).abs().max()<2.0, 'bf16 vs fp32'; "
        "f=a.to(torch.float8_e4m3fn); s=torch.tensor(1.0,device='cuda'); "
        "o=torch._scaled_mm(f, f.t().contiguous().t(), scale_a=s, scale_b=s, out_dtype=torch.bfloat16); "
        "torch.cuda.synchronize(); assert torch.isfinite(o.float()).all(); print('OK')",
    ),
    "nvidia-cudnn-cu13": (
        "conv2d and scaled-dot-product attention through cuDNN",
        "import torch; torch.backends.cudnn.enabled=True; "
        "x=torch.randn(8,16,32,32,device='cuda'); w=torch.randn(32,16,3,3,device='cuda'); "
        "y=torch.nn.functional.conv2d(x,w); "
        "from torch.nn.attention import sdpa_kernel, SDPBackend; "
        "q=torch.randn(2,8,128,64,device='cuda',dtype=torch.bfloat16); "
        "ctx=sdpa_kernel([SDPBackend.CUDNN_ATTENTION]); ctx.__enter__(); "
        "o=torch.nn.functional.scaled_dot_product_attention(q,q,q); ctx.__exit__(None,None,None); "
        "torch.cuda.synchronize(); assert torch.isfinite(y).all() and torch.isfinite(o.float()).all(); print('OK')",
    ),
    "nvidia-cufft": (
        "fft and rfft2 through cuFFT, checked against the CPU",
        "import torch; x=torch.randn(4096); g=torch.fft.fft(x.cuda()).cpu(); c=torch.fft.fft(x); "
        "assert (g-c).abs().max()<1e-2; r=torch.fft.rfft2(torch.randn(64,64,device='cuda')); "
        "torch.cuda.synchronize(); assert torch.isfinite(torch.view_as_real(r)).all(); print('OK')",
    ),
    "nvidia-cusparse": (
        "CSR x dense through cuSPARSE, checked against dense",
        "import torch; d=torch.randn(256,256,device='cuda'); d[d.abs()<1.0]=0; s=d.to_sparse_csr(); "
        "v=torch.randn(256,64,device='cuda'); assert ((s@v)-(d@v)).abs().max()<1e-2; print('OK')",
    ),
    "nvidia-cusparselt-cu13": (
        "2:4 semi-structured sparse matmul through cuSPARSELt",
        "import torch; from torch.sparse import to_sparse_semi_structured, SparseSemiStructuredTensor; "
        "SparseSemiStructuredTensor._FORCE_CUTLASS=False; "
        "m=torch.tensor([0,0,1,1],device='cuda',dtype=torch.bool).tile(128,32); "
        "a=(torch.randn(128,128,device='cuda',dtype=torch.float16)*m); "
        "b=torch.randn(128,128,device='cuda',dtype=torch.float16); "
        "s=to_sparse_semi_structured(a); o=s@b; assert (o-(a@b)).abs().max()<0.5; "
        "print('backend', type(s).__name__); print('OK')",
    ),
    "nvidia-nccl-cu13": (
        "an all-reduce through NCCL with one rank",
        "import os, torch, torch.distributed as dist; os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='29533'); "
        "dist.init_process_group('nccl', rank=0, world_size=1); t=torch.ones(1024,device='cuda'); dist.all_reduce(t); "
        "torch.cuda.synchronize(); assert t.sum().item()==1024; dist.destroy_process_group(); print('OK')",
    ),
    "nvidia-cusolver": (
        "a Cholesky factorisation and eigh through cuSOLVER",
        "import torch; torch.backends.cuda.preferred_linalg_library('cusolver'); a=torch.randn(128,128,device='cuda'); "
        "p=a@a.T+128*torch.eye(128,device='cuda'); l=torch.linalg.cholesky(p); w=torch.linalg.eigh(p).eigenvalues; "
        "assert ((l@l.T)-p).abs().max()<1e-2 and (w>0).all(); print('OK')",
    ),
    "nvidia-curand": (
        "random numbers through cuRAND (CuPy's generator)",
        "import cupy; x=cupy.random.default_rng(1).standard_normal(10000); "
        "assert abs(float(x.mean()))<0.1; print('OK')",
    ),
    "nvidia-cuda-nvrtc": (
        "a kernel compiled at run time by NVRTC (CuPy RawKernel) and launched",
        "import cupy; k=cupy.RawKernel(r'extern \"C\" __global__ void f(float* x){x[threadIdx.x]+=1;}', 'f'); "
        "x=cupy.zeros(32,dtype=cupy.float32); k((1,),(32,),(x,)); assert float(x.sum())==32; print('OK')",
    ),
    "cupy-cuda13x": (
        "an elementwise kernel, a reduction and a dot product in CuPy",
        "import cupy; a=cupy.arange(1<<20,dtype=cupy.float32); assert float((a*2).sum())==float(a.sum())*2; "
        "m=cupy.random.rand(64,64,dtype=cupy.float32); "
        "assert cupy.allclose(m@cupy.eye(64,dtype=cupy.float32), m); print('OK')",
    ),
    "jax-cuda13-plugin": (
        "a jitted matmul on the GPU through JAX's CUDA plugin",
        "import jax, jax.numpy as jnp; d=jax.devices('gpu')[0]; x=jax.device_put(jnp.ones((256,256)), d); "
        "y=jax.jit(lambda a: a@a)(x); assert float(y[0,0])==256.0; print('OK')",
    ),
    "torchvision": (
        "nms and roi_align on the GPU",
        "import torch, torchvision; b=torch.rand(100,4,device='cuda')*100; b[:,2:]+=b[:,:2]; "
        "k=torchvision.ops.nms(b, torch.rand(100,device='cuda'), 0.5); "
        "r=torchvision.ops.roi_align(torch.randn(1,3,32,32,device='cuda'), [b[:4]], 7); "
        "torch.cuda.synchronize(); assert k.numel()>0 and r.shape==(4,3,7,7); print('OK')",
    ),
    "torchaudio": (
        "forced_align on the GPU",
        "import torch, torchaudio.functional as F; lp=torch.randn(1,50,10,device='cuda').log_softmax(-1); "
        "t=torch.tensor([[1,2,3]],device='cuda',dtype=torch.int32); a,s=F.forced_align(lp,t,blank=0); "
        "torch.cuda.synchronize(); print('OK')",
    ),
    "triton": (
        "a Triton kernel compiled (ptxas) and launched",
        "import torch, triton, triton.language as tl\n"
        "@triton.jit\ndef k(x, n: tl.constexpr):\n    i=tl.arange(0,n); tl.store(x+i, tl.load(x+i)+1)\n"
        "x=torch.zeros(128,device='cuda'); k[(1,)](x, 128); torch.cuda.synchronize(); "
        "assert x.sum().item()==128; print('OK')",
    ),
    "numba-cuda": (
        "a numba.cuda kernel",
        "from numba import cuda; import numpy as np\n"
        "@cuda.jit\ndef f(a):\n    i=cuda.grid(1)\n    a[i]+=1\n"
        "d=cuda.to_device(np.zeros(64,np.float32)); f[1,64](d); assert d.copy_to_host().sum()==64; print('OK')",
    ),
}
# Distributions whose CUDA code is reached only through another one's operation
ALSO_BY = {
    "nvidia-cuda-runtime": "torch",
    "nvidia-nvjitlink": "nvidia-cufft",
    "jax-cuda13-pjrt": "jax-cuda13-plugin",
    "jaxlib": "jax-cuda13-plugin",
}


def canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def site_dirs() -> list[Path]:
    seen: list[Path] = []
    for key in ("purelib", "platlib"):
        p = Path(sysconfig.get_paths()[key]).resolve()
        if p.is_dir() and p not in seen:
            seen.append(p)
    return seen


def distributions(site: Path) -> dict[str, dict]:
    """name -> {version, files (paths relative to site)} from each dist-info's RECORD."""
    out: dict[str, dict] = {}
    for info in sorted(site.glob("*.dist-info")):
        stem = info.name[: -len(".dist-info")]
        name, _, version = stem.rpartition("-")
        meta = info / "METADATA"
        if meta.is_file():
            for line in meta.read_text(errors="replace").splitlines():
                if line.startswith("Name:"):
                    name = line.split(":", 1)[1].strip()
                    break
        files: list[str] = []
        rec = info / "RECORD"
        if rec.is_file():
            with rec.open(newline="", errors="replace") as f:
                files = [row[0] for row in csv.reader(f) if row]
        out[canon(name)] = {"name": name, "version": version, "files": files}
    return out


def _sections(f, data_len: int) -> list[tuple[str, int, int]]:
    """(name, offset, size) of every section with bytes in the file (SHT_NOBITS left out)."""
    f.seek(0)
    ident = f.read(64)
    if len(ident) < 64 or ident[:4] != ELF_MAGIC or ident[4] != 2:
        return []
    (e_shoff,) = struct.unpack_from("<Q", ident, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
    if not e_shoff or e_shentsize < 64 or e_shnum > 100000 or e_shoff > data_len:
        return []
    f.seek(e_shoff)
    table = f.read(e_shentsize * e_shnum)
    rows = []
    for i in range(e_shnum):
        name, stype, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", table, i * e_shentsize)
        rows.append((name, off, 0 if stype == 8 else size))
    if e_shstrndx >= len(rows):
        return []
    _, soff, ssize = rows[e_shstrndx]
    f.seek(soff)
    strtab = f.read(min(ssize, 1 << 24))
    out = []
    for name, off, size in rows:
        end = strtab.find(b"\0", name)
        out.append((strtab[name:end].decode(errors="replace"), off, size))
    return out


def walk_fatbin(blob: bytes) -> list[list[tuple]]:
    """Containers, each a list of entries (kind, sm, flags, major, minor, header_version).

    Containers are found by their magic wherever they start (a data section that embeds
    them need not align them to 8), and a candidate whose header is not a container's
    (header size 16, entries inside the blob) is passed over."""
    containers: list[list[tuple]] = []
    magic_bytes, n = struct.pack("<I", FATBIN_MAGIC), len(blob)
    pos = blob.find(magic_bytes)
    while pos != -1 and pos + 16 <= n:
        _magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", blob, pos)
        if hsize != 16 or pos + hsize + fsize > n:
            pos = blob.find(magic_bytes, pos + 4)
            continue
        entries: list[tuple] = []
        e, end = pos + hsize, pos + hsize + fsize
        while e + 64 <= end:
            kind, ever, ehsize, psize = struct.unpack_from("<HHIQ", blob, e)
            minor, major, sm = struct.unpack_from("<HHI", blob, e + 24)
            (flags,) = struct.unpack_from("<Q", blob, e + 40)
            entries.append((kind, sm, flags, major, minor, ever))
            if ehsize == 0:
                break
            e += ehsize + psize
        containers.append(entries)
        pos = blob.find(magic_bytes, max(end, pos + 16))
    return containers


def file_record(path: Path) -> dict | None:
    """What one ELF carries: a cubin's SM, or its fatbin containers as signatures with counts."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            secs = _sections(f, size)
            if not secs:
                return None
            f.seek(0)
            head = f.read(64)
            (machine,) = struct.unpack_from("<H", head, 0x12)
            if machine == 190:  # a cubin
                (flags,) = struct.unpack_from("<I", head, 0x30)
                return {"kind": "cubin", "size": size, "e_flags": hex(flags), "abiversion": head[8]}
            sigs: Counter[str] = Counter()
            elsewhere: dict[str, dict[str, int]] = {}
            for name, off, ssize in secs:
                if not ssize or off + ssize > size:
                    continue
                f.seek(off)
                blob = f.read(ssize)
                if name != ".nv_fatbin" and struct.pack("<I", FATBIN_MAGIC) not in blob:
                    continue
                found: Counter[str] = Counter()
                for cont in walk_fatbin(blob):
                    sig = " ".join(f"k{k}:{sm}:{fl:#x}:{ma}.{mi}" for k, sm, fl, ma, mi, _v in sorted(set(cont)))
                    found[sig] += 1
                if name == ".nv_fatbin":
                    sigs.update(found)
                elif found:
                    elsewhere[name] = dict(found)
            if not sigs and not elsewhere:
                return None
            rec = {"kind": "so", "size": size, "containers": dict(sigs)}
            if elsewhere:
                rec["fatbins_in_other_sections"] = elsewhere
            return rec
    except OSError as e:
        return {"kind": "error", "error": str(e)}


def cuobjdump_counts(path: Path) -> dict | None:
    """cuobjdump's own listing, counted per architecture (ELF and PTX), where the tool exists."""
    out: dict[str, Counter] = {"elf": Counter(), "ptx": Counter()}
    for flag, key in (("--list-elf", "elf"), ("--list-ptx", "ptx")):
        try:
            r = subprocess.run(["cuobjdump", flag, str(path)], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"error": str(e)}
        for line in r.stdout.splitlines():
            for tok in line.replace(".", " ").split():
                if tok.startswith("sm_") or tok.startswith("compute_"):
                    out[key][tok] += 1
                    break
    return {k: dict(v) for k, v in out.items()}


def run_op(src: str, timeout: float) -> dict:
    """Run one operation from a file of its own (Triton's @jit reads its source from a file)."""
    import tempfile

    t0 = time.monotonic()
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    try:
        r = subprocess.run([sys.executable, f.name], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ran": False, "error": f"timed out after {timeout:.0f} s", "seconds": timeout}
    finally:
        os.unlink(f.name)
    ok = r.returncode == 0 and "OK" in r.stdout.split()
    tail = (r.stderr.strip().splitlines() or [""])[-1][:400]
    res = {"ran": ok, "rc": r.returncode, "seconds": round(time.monotonic() - t0, 2)}
    extra = [ln for ln in r.stdout.splitlines() if ln.strip() and ln.strip() != "OK"]
    if extra:
        res["said"] = extra[-3:]
    if not ok:
        res["error"] = tail or r.stdout.strip()[-400:]
    return res


# Shapes of compiled code, built here with nvcc and launched on this GPU: the rules' ground truth.
# Each: (name, [(kernel, gencode flags)], the kernel launched). Kernels of one shape live in
# translation units of their own, so each is its own fatbin container in the .so.
SHAPES: list[tuple[str, list[tuple[str, list[str]]], str]] = [
    (
        "sass_90 unit + sm_100a-only unit, launch the sm_90 kernel",
        [("f", ["arch=compute_90,code=sm_90"]), ("g", ["arch=compute_100a,code=sm_100a"])],
        "f",
    ),
    (
        "sass_90 unit + sm_100a-only unit, launch the sm_100a-only kernel",
        [("f", ["arch=compute_90,code=sm_90"]), ("g", ["arch=compute_100a,code=sm_100a"])],
        "g",
    ),
    ("sass_90a only", [("f", ["arch=compute_90a,code=sm_90a"])], "f"),
    ("ptx compute_90 only (driver JIT)", [("f", ["arch=compute_90,code=compute_90"])], "f"),
    ("ptx compute_80 only (driver JIT)", [("f", ["arch=compute_80,code=compute_80"])], "f"),
    ("ptx compute_120 only (newer than the GPU)", [("f", ["arch=compute_120,code=compute_120"])], "f"),
    ("sass sm_100a + sm_120, no PTX", [("f", ["arch=compute_100a,code=sm_100a", "arch=compute_120,code=sm_120"])], "f"),
    (
        "LTO IR lto_90 + sass sm_100a (nvcc takes lto_ only beside a real target)",
        [("f", ["arch=compute_90,code=lto_90", "arch=compute_100a,code=sm_100a"])],
        "f",
    ),
    ("sass sm_80 only (older SASS, same major? no: 8.0 on 9.0)", [("f", ["arch=compute_80,code=sm_80"])], "f"),
]
_KERNEL = """
#include <cuda_runtime.h>
__global__ void k_{k}(int* x) {{ x[threadIdx.x] += 1; }}
extern "C" const char* launch_{k}() {{
  int* d; if (cudaMalloc(&d, 32 * sizeof(int)) != cudaSuccess) return "cudaMalloc failed";
  cudaMemset(d, 0, 32 * sizeof(int));
  k_{k}<<<1, 32>>>(d);
  cudaError_t e = cudaGetLastError(); if (e == cudaSuccess) e = cudaDeviceSynchronize();
  int h[32]; cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost); cudaFree(d);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  for (int i = 0; i < 32; i++) if (h[i] != 1) return "wrong result";
  return "OK";
}}
"""


def shape_runs(work: Path) -> list[dict]:
    """Build each shape with nvcc, read it with this script's walker, launch it (ctypes, own process)."""
    out = []
    for i, (name, units, launch) in enumerate(SHAPES):
        d = work / f"shape{i}"
        d.mkdir(parents=True, exist_ok=True)
        objs, err = [], ""
        so = d / "shape.so"
        for k, gencodes in units:
            (d / f"{k}.cu").write_text(_KERNEL.format(k=k))
            gen = [a for g in gencodes for a in ("-gencode", g)]
            # one unit: compile and link in one call (how nvcc accepts an lto_ target without -rdc)
            out_args = ["-shared", "-o", str(so)] if len(units) == 1 else ["-c", "-o", str(d / f"{k}.o")]
            cmd = ["nvcc", *gen, "-Xcompiler", "-fPIC", *out_args, str(d / f"{k}.cu")]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if r.returncode:
                err = r.stderr.strip()[-300:]
                break
            objs.append(str(d / f"{k}.o"))
        if not err and len(units) > 1:
            r = subprocess.run(["nvcc", "-shared", "-o", str(so), *objs], capture_output=True, text=True, timeout=300)
            err = r.stderr.strip()[-300:] if r.returncode else ""
        row: dict = {"shape": name, "units": [[k, g] for k, g in units], "launched": launch}
        if err:
            row["build_error"] = err
            out.append(row)
            continue
        row["carries"] = file_record(so)
        src = (
            "import ctypes, sys; lib=ctypes.CDLL(sys.argv[1]); fn=getattr(lib, 'launch_' + sys.argv[2]); "
            "fn.restype=ctypes.c_char_p; print(fn().decode())"
        )
        r = subprocess.run([sys.executable, "-c", src, str(so), launch], capture_output=True, text=True, timeout=120)
        said = (r.stdout.strip().splitlines() or [r.stderr.strip()[-300:]])[-1]
        row["ran"] = r.returncode == 0 and said == "OK"
        row["said"] = said
        out.append(row)
        print(f"shape {i}: {row['ran']!s:6} {said[:60]:60} {name}", flush=True)
    return out


def gpu_facts() -> dict:
    src = (
        "import json, torch; p=torch.cuda.get_device_properties(0); "
        "print(json.dumps({'name': p.name, 'cc': f'{p.major}.{p.minor}', 'torch': torch.__version__, "
        "'cuda': torch.version.cuda, 'arch_list': torch.cuda.get_arch_list()}))"
    )
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=120)
    facts = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": r.stderr[-400:]}
    q = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
    )
    facts["driver"] = q.stdout.strip().splitlines()[0] if q.returncode == 0 and q.stdout.strip() else None
    return facts


def census_said(sites: list[Path], archs: list[str], driver: str | None) -> dict:
    """What the sm120patch census beside this script says (its own code, for the record)."""
    sys.path.insert(0, str(HERE))
    try:
        from sm120patch.arch import parse_arch
        from sm120patch.census import census

        rep = census(sites, [parse_arch(a) for a in archs], driver, cache_root=Path("/tmp/sm120patch-census"))
    except Exception as e:  # the record says the census failed; it is not this script's verdict
        return {"error": f"{type(e).__name__}: {e}"}
    said: dict[str, dict] = {}
    for row in rep["distributions"]:
        said[canon(row["name"])] = {
            a: {k: g.get(k) for k in ("status", "cannot_run", "partial", "you_will_see", "fix", "note") if g.get(k)}
            for a, g in row["gpus"].items()
        }
    return {"by_dist": said, "files_read": rep.get("files_read"), "elapsed_s": rep.get("elapsed_s")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("--no-cuobjdump", action="store_true")
    ap.add_argument("--shapes-only", action="store_true", help="only the nvcc-built shapes")
    args = ap.parse_args()

    facts = gpu_facts()
    record: dict = {"gpu": facts, "python": sys.version.split()[0], "sites": [], "distributions": {}}
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        record["shapes"] = shape_runs(Path(work))
    if args.shapes_only:
        args.out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        return 0
    sites = site_dirs()
    record["sites"] = [str(s) for s in sites]
    for site in sites:
        for key, d in distributions(site).items():
            files = {}
            for rel in d["files"]:
                p = (site / rel).resolve()
                if not p.is_file() or not (p.suffix == ".cubin" or ".so" in p.name):
                    continue
                rec = file_record(p)
                if rec is None:
                    continue
                if rec.get("kind") == "so" and not args.no_cuobjdump:
                    rec["cuobjdump"] = cuobjdump_counts(p)
                files[rel] = rec
            if files:
                record["distributions"][key] = {"name": d["name"], "version": d["version"], "files": files}
    for key, d in record["distributions"].items():
        if key in OPS:
            what, src = OPS[key]
            d["op"] = what
            d["result"] = run_op(src, args.timeout)
        elif key in ALSO_BY:
            d["op"] = f"reached through {ALSO_BY[key]}'s operation"
        else:
            d["op"] = "not exercised"
        print(f"{key:28} {d['version']:16} {d.get('result', {}).get('ran', '-')!s:6} {d['op']}", flush=True)
    for key, (what, src) in OPS.items():  # operations of distributions with no CUDA files of their own
        if key not in record["distributions"]:
            record.setdefault("also_ran", {})[key] = {"op": what, "result": run_op(src, args.timeout)}
    cc = facts.get("cc", "")
    here = f"sm_{cc.replace('.', '')}" if cc else None
    archs = [a for a in (here, "sm_120", "sm_121") if a]
    record["census_said"] = census_said(sites, archs, facts.get("driver"))
    args.out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
