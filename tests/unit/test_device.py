"""Machine detection without a GPU: parsers, toolkit arch limits, --arch override, torch subprocess."""

from __future__ import annotations

import json
import sys

from sm120patch.arch import Arch, parse_arch
from sm120patch.probes.environment.device import (
    CudaToolkit,
    Gpu,
    Machine,
    archs_present,
    can_build_for,
    detect,
    parse_nvcc_version,
    parse_nvidia_smi,
    torch_info,
)


def test_parse_nvidia_smi_mixed() -> None:
    text = (
        "NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0, 580.1\n"
        "NVIDIA H200, 9.0, 580.1\nNVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0, 580.1\n"
    )
    gpus, driver = parse_nvidia_smi(text)
    assert [g.arch.name for g in gpus] == ["sm_120", "sm_90", "sm_120"]
    assert driver == "580.1"
    m = Machine(gpus, driver, CudaToolkit(), None)
    assert archs_present(m) == [Arch(9, 0), Arch(12, 0)]
    json.dumps(m.to_dict())


def test_parse_nvcc_version() -> None:
    assert parse_nvcc_version("Cuda compilation tools, release 13.0, V13.0.88") == "13.0"
    assert parse_nvcc_version("garbage") is None


def test_can_build_for() -> None:
    sm120, sm121 = parse_arch("sm_120"), parse_arch("sm_121")
    assert can_build_for(CudaToolkit("12.8"), sm120)[0]
    assert not can_build_for(CudaToolkit("12.8"), sm120, family=True)[0]
    assert not can_build_for(CudaToolkit("12.8"), sm121)[0]
    assert can_build_for(CudaToolkit("12.9"), sm121)[0]
    assert not can_build_for(CudaToolkit("12.6"), sm120)[0]
    ok, why = can_build_for(CudaToolkit(), sm120)
    assert not ok and "no CUDA toolkit" in why


def test_arch_override_skips_detection() -> None:
    m = detect([parse_arch("sm_120"), parse_arch("sm_121"), parse_arch("sm_120")], with_torch=False)
    assert m.overridden and [g.source for g in m.gpus] == ["--arch"] * 3
    assert [a.name for a in archs_present(m)] == ["sm_120", "sm_121"]
    d = m.to_dict()
    assert d["archs"] == ["sm_120", "sm_121"] and d["torch"] is None
    json.dumps(d)


def test_torch_info_without_torch(tmp_path) -> None:
    # an interpreter with no torch: reported, not raised
    info, gpus = torch_info(sys.executable, gpus=True)
    if info.version is None:
        assert "ModuleNotFoundError" in info.error
    assert isinstance(gpus, list)
    info, _ = torch_info(str(tmp_path / "no-python"))
    assert info.error and info.version is None


def test_gpu_to_dict() -> None:
    assert Gpu(0, "x", 12, 1, "nvml").to_dict()["arch"] == "sm_121"
