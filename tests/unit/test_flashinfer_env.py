"""Locating FlashInfer without importing it: trees of each shape, another interpreter, caches."""

from __future__ import annotations

import sys

import pytest

from sm120patch.errors import TargetError
from sm120patch.probes.environment.flashinfer import from_python, from_tree, user_cache_dirs
from tests.unit.fi_fakes import make_tree


def test_wheel_tree(tmp_path) -> None:
    make_tree(tmp_path, version="0.6.17")
    (tmp_path / "flashinfer_cubin" / "cubins").mkdir(parents=True)
    (tmp_path / "flashinfer_cubin" / "__init__.py").write_text("")
    for where in (tmp_path, tmp_path / "flashinfer"):
        fi = from_tree(where)
        assert fi.version == "0.6.17" and fi.source == "tree"
        assert fi.package_dir == tmp_path / "flashinfer"
        assert fi.cubin_dir == tmp_path / "flashinfer_cubin" / "cubins"
        assert fi.dist_versions == {"flashinfer-python": "0.6.17"}


def test_repo_tree_version_txt(tmp_path) -> None:
    make_tree(tmp_path, version="0.7.0rc1", layout="repo")
    assert from_tree(tmp_path).version == "0.7.0rc1"


def test_not_a_tree(tmp_path) -> None:
    with pytest.raises(TargetError, match="no flashinfer/__init__.py"):
        from_tree(tmp_path)


def test_from_python_subprocess(tmp_path) -> None:
    make_tree(tmp_path, version="0.6.1")
    fi = from_python(sys.executable, extra_path=str(tmp_path))
    assert fi.found and fi.version == "0.6.1" and fi.python == sys.executable
    assert "flashinfer" not in sys.modules  # located, never imported here
    missing = from_python(str(tmp_path / "nope"))
    assert not missing.found and missing.error


def test_user_cache_dirs(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    d = tmp_path / ".cache" / "flashinfer" / "0.6.1" / "90a_120f" / "cached_ops"
    d.mkdir(parents=True)
    assert user_cache_dirs("0.6.1") == [d]
    assert user_cache_dirs("0.7.4") == []
