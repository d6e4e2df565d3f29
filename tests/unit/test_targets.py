"""Targets: which layouts are found, where the version comes from, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120patch.errors import TargetError
from sm120patch.planning.targets import discover, installed, read_version
from tests.unit.sglang_fakes import git, make_clone, make_sglang


def make_flashinfer(parent: Path, version: str | None = "0.6.17") -> Path:
    pkg = parent / "flashinfer"
    (pkg / "jit").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .version import __version__\n")
    if version:
        (pkg / "version.py").write_text(f'__version__ = "{version}"\n')
    return pkg


def one_line_target_error(path: Path, fragment: str, **kw: object) -> str:
    with pytest.raises(TargetError) as ei:
        discover(path, **kw)  # type: ignore[arg-type]
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(str(path)) and fragment in msg, msg
    return msg


def test_clone_layout(tmp_path: Path) -> None:
    root = make_clone(tmp_path / "sglang")
    (t,) = discover(root)
    assert t.package == "sglang" and t.is_git
    assert t.root == root.resolve() and t.package_dir == (root / "python" / "sglang").resolve()
    assert t.version == "0.5.9" and t.version_source.endswith("python/sglang/version.py")
    assert t.rel(t.package_dir / "srt" / "server_args.py") == "python/sglang/srt/server_args.py"
    d = t.to_dict()
    assert d["package"] == "sglang" and d["version"] == "0.5.9" and d["root"] == str(root.resolve()) and d["git"]


@pytest.mark.parametrize("sub", ["python", "python/sglang"])
def test_clone_found_from_inside(tmp_path: Path, sub: str) -> None:
    # naming python/ or python/sglang/ of a clone still owns edits at the clone root
    root = make_clone(tmp_path / "sglang")
    (t,) = discover(root / sub)
    assert t.package_dir == (root / "python" / "sglang").resolve()
    assert t.is_git and t.root == root.resolve()
    assert t.rel(t.package_dir / "srt" / "utils.py") == "python/sglang/srt/utils.py"


def test_wheel_layout_version_from_dist_info(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    pkg = make_sglang(site)
    (pkg / "version.py").unlink()
    meta = site / "sglang-0.5.10rc1.dist-info" / "METADATA"
    meta.parent.mkdir()
    meta.write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.10rc1\n\nlong description\nVersion: 9\n")
    (t,) = discover(site)
    assert t.package_dir == pkg.resolve() and t.root == site.resolve() and not t.is_git
    assert t.version == "0.5.10rc1" and t.version_source == str(meta.resolve())


def test_package_folder_itself(tmp_path: Path) -> None:
    pkg = make_sglang(tmp_path / "unpacked", version="0.5.7")
    (t,) = discover(pkg)
    assert t.package_dir == pkg.resolve() and t.root == pkg.resolve() and t.version == "0.5.7"
    assert t.rel(pkg.resolve() / "srt" / "utils.py") == "srt/utils.py"


def test_flashinfer_layout_and_both_packages(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    make_flashinfer(site)
    make_sglang(site)
    targets = discover(site)
    assert [(t.package, t.version) for t in targets] == [("sglang", "0.5.9"), ("flashinfer", "0.6.17")]
    (fi,) = discover(site, package="flashinfer")
    assert fi.package_dir == (site / "flashinfer").resolve()


def test_flashinfer_clone_found_from_package_folder(tmp_path: Path) -> None:
    root = tmp_path / "flashinfer-src"
    make_flashinfer(root)
    git(root, "init", "-q")
    (t,) = discover(root / "flashinfer")
    assert t.is_git and t.root == root.resolve()


def test_package_without_marker_is_not_a_target(tmp_path: Path) -> None:
    pkg = tmp_path / "sglang"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")  # no srt/: a namesake, not SGLang
    one_line_target_error(tmp_path, "holds no sglang or flashinfer package")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("version.py", '__version__ = "0.5.6"\n'),
        ("_version.py", 'version = "0.5.6"\n__version__ = version\n'),
        ("__init__.py", 'import os\n__version__ = "0.5.6"\n'),
    ],
)
def test_version_files(tmp_path: Path, name: str, text: str) -> None:
    pkg = make_sglang(tmp_path)
    (pkg / "version.py").unlink()
    (pkg / name).write_text(text)
    assert read_version("sglang", pkg, None) == ("0.5.6", str(pkg / name))


def test_version_not_from_a_computed_expression(tmp_path: Path) -> None:
    pkg = make_sglang(tmp_path)
    (pkg / "version.py").write_text("__version__ = get_version()\n")
    assert read_version("sglang", pkg, None) == (None, "not found")
    (pkg / "version.py").write_text("this is not python (\n")
    assert read_version("sglang", pkg, None) == (None, "not found")


def test_version_from_pyproject(tmp_path: Path) -> None:
    pkg = make_sglang(tmp_path / "python")
    (pkg / "version.py").unlink()
    (tmp_path / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "0.5.8"\n')
    (t,) = discover(tmp_path)
    assert (t.version, t.version_source) == ("0.5.8", str((tmp_path / "python" / "pyproject.toml").resolve()))


def test_version_file_wins_over_dist_info(tmp_path: Path) -> None:
    make_sglang(tmp_path, version="0.5.9")
    meta = tmp_path / "sglang-0.5.1.dist-info" / "METADATA"
    meta.parent.mkdir()
    meta.write_text("Version: 0.5.1\n")
    (t,) = discover(tmp_path)
    assert t.version == "0.5.9"


@pytest.mark.parametrize(
    ("tag", "expected"),
    [
        ("v0.5.9", "0.5.9"),
        ("v0.5.10rc1", "0.5.10rc1"),
        ("0.5.3.post1", "0.5.3.post1"),
    ],
)
def test_version_from_git_describe(tmp_path: Path, tag: str, expected: str) -> None:
    root = make_clone(tmp_path / "sglang", version=None, tag=tag)
    (t,) = discover(root)
    assert (t.version, t.version_source) == (expected, "git describe")


def test_untagged_clone_has_no_version(tmp_path: Path) -> None:
    root = make_clone(tmp_path / "sglang", version=None)
    (t,) = discover(root)
    assert t.is_git and (t.version, t.version_source) == (None, "not found")


def test_errors_are_one_line(tmp_path: Path) -> None:
    f = tmp_path / "file.py"
    f.write_text("x = 1\n")
    one_line_target_error(f, "is a file")
    one_line_target_error(tmp_path, "holds no sglang or flashinfer package")
    one_line_target_error(tmp_path / "missing", "no such file or folder")
    make_flashinfer(tmp_path)
    one_line_target_error(tmp_path, "holds no sglang package", package="sglang")


def test_venv_inside_a_git_repo_is_not_a_clone(tmp_path: Path) -> None:
    repo = tmp_path / "myproject"
    repo.mkdir()
    git(repo, "init", "-q")
    site = repo / ".venv" / "lib" / "python3.11" / "site-packages"
    make_sglang(site)
    make_flashinfer(site)
    for path in (site, site / "sglang", site / "flashinfer"):
        for t in discover(path):
            assert not t.is_git, (path, t)
            assert repo.resolve() != t.root
    # and a venv inside an SGLang clone is not that clone either
    clone = make_clone(tmp_path / "sglang")
    venv_site = clone / "python" / ".venv" / "lib" / "python3.11" / "site-packages"
    make_sglang(venv_site, version="0.5.5")
    (t,) = discover(venv_site)
    assert not t.is_git and t.root == venv_site.resolve() and t.version == "0.5.5"


def test_installed_not_found() -> None:
    with pytest.raises(TargetError) as ei:
        installed("sglang_definitely_not_installed")
    assert "not installed" in str(ei.value) and "\n" not in str(ei.value)


def test_installed_finds_a_package_on_sys_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    make_sglang(site, version="0.5.11")
    monkeypatch.syspath_prepend(str(site))
    import importlib

    importlib.invalidate_caches()
    monkeypatch.delitem(__import__("sys").modules, "sglang", raising=False)
    t = installed("sglang")
    assert t.package_dir == (site / "sglang").resolve() and t.version == "0.5.11" and not t.is_git
