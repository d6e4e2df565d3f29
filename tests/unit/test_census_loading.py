"""How a package loads a compiled module, read from its own source (census/loading.py), on small packages written
here: a top-level import is loaded at import, one in a try block is optional, one inside a function only a feature
calls is on-use, and a function the top level runs (directly or through another) loads at import; a loader's glob
counts, a message that merely mentions the module does not. preflight fails only where a module without an image
is loaded at start; otherwise it warns. The real wheel (sglang-kernel 0.4.10) is in
tests/integration/test_census_wheels.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120patch.census.loading import IMPORT, ON_USE, OPTIONAL, UNKNOWN, how_loaded, module_name
from sm120patch.engine.preflight import census_fails


def _pkg(site: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = site / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    (site / "kern" / "fast_ops.abi3.so").write_bytes(b"\x7fELF")
    return site


@pytest.mark.parametrize(
    ("files", "kind", "where"),
    [
        ({"kern/__init__.py": "from kern import fast_ops\n"}, IMPORT, "kern/__init__.py:1"),
        ({"kern/__init__.py": "from . import fast_ops\n"}, IMPORT, "kern/__init__.py:1"),
        ({"kern/__init__.py": "import kern.fast_ops as f\n"}, IMPORT, "kern/__init__.py:1"),
        (
            {"kern/mla.py": "try:\n    from kern import fast_ops\nexcept ImportError as e:\n    err = e\n"},
            OPTIONAL,
            "kern/mla.py:2",
        ),
        (  # a try whose handler does not catch the import's failure guards nothing
            {"kern/mla.py": "try:\n    from kern import fast_ops\nexcept KeyError:\n    pass\n"},
            IMPORT,
            "kern/mla.py:2",
        ),
        ({"kern/mla.py": "def run():\n    from kern import fast_ops\n    return fast_ops\n"}, ON_USE, "kern/mla.py:2"),
        (  # the top level runs load(), which runs find(): loaded at import
            {
                "kern/__init__.py": "from kern.loader import load\nops = load()\n",
                "kern/loader.py": "import glob\ndef find():\n    return glob.glob('fast_ops*.so')\n"
                "def load():\n    return find()\n",
            },
            IMPORT,
            "kern/loader.py:3",
        ),
        (  # the same loader, called only from a feature's function
            {
                "kern/feature.py": "from kern.loader import load\ndef attend():\n    return load()\n",
                "kern/loader.py": "import glob\ndef load():\n    return glob.glob('fast_ops*.so')\n",
            },
            ON_USE,
            "kern/loader.py:3",
        ),
        (  # a message that names the module is not a place that loads it
            {"kern/mla.py": 'ERR = "Failed to load kern.fast_ops: install a build for your GPU"\n'},
            UNKNOWN,
            "",
        ),
        ({"kern/__init__.py": "x = 1\n"}, UNKNOWN, ""),
    ],
)
def test_how_a_package_loads_its_module(tmp_path: Path, files: dict[str, str], kind: str, where: str) -> None:
    site = _pkg(tmp_path, files)
    got = how_loaded(site, "kern/fast_ops.abi3.so")
    assert (got.kind, got.where) == (kind, where)
    assert got.at_start == (kind in (IMPORT, UNKNOWN))


def test_the_strongest_place_decides(tmp_path: Path) -> None:
    site = _pkg(
        tmp_path,
        {
            "kern/mla.py": "try:\n    from kern import fast_ops\nexcept Exception:\n    pass\n",
            "kern/other.py": "def f():\n    from kern import fast_ops\n",
            "kern/__init__.py": "from kern import fast_ops\n",
        },
    )
    assert how_loaded(site, "kern/fast_ops.abi3.so").kind == IMPORT


def test_module_names_and_a_file_that_does_not_parse(tmp_path: Path) -> None:
    assert module_name("sgl_kernel/sm100/common_ops.abi3.so") == ("sgl_kernel.sm100", "common_ops")
    assert module_name("x/_C.cpython-311-x86_64-linux-gnu.so") == ("x", "_C")
    site = _pkg(tmp_path, {"kern/broken.py": "def (:\n", "kern/ok.py": "def f():\n    import kern.fast_ops\n"})
    assert how_loaded(site, "kern/fast_ops.abi3.so").kind == ON_USE
    assert how_loaded(tmp_path, "nopkg/thing.so").kind == UNKNOWN


def _census(site: Path, modules: list[str]) -> dict:
    return {
        "site_packages": [str(site)],
        "problems": [
            {
                "package": "sglang-kernel",
                "version": "9.9",
                "gpu": "sm_121",
                "status": "some",
                "modules": modules,
                "you_will_see": ["CUDA error: no kernel image is available for execution on the device"],
            }
        ],
    }


def test_preflight_warns_for_a_module_loaded_only_on_use_and_fails_for_one_loaded_at_import(tmp_path: Path) -> None:
    site = _pkg(tmp_path, {"kern/mla.py": "try:\n    from kern import fast_ops\nexcept ImportError:\n    pass\n"})
    (site / "kern" / "core_ops.abi3.so").write_bytes(b"\x7fELF")
    (site / "kern" / "__init__.py").write_text("from kern import core_ops\n", encoding="utf-8")
    fails, warnings = census_fails(_census(site, ["kern/fast_ops.abi3.so"]))
    assert fails == [] and len(warnings) == 1
    assert "kern/fast_ops.abi3.so: imported in a try block (kern/mla.py:2)" in warnings[0]
    assert "it starts, and the features that call them fail" in warnings[0]
    report = _census(site, ["kern/fast_ops.abi3.so", "kern/core_ops.abi3.so"])
    fails, warnings = census_fails(report)
    assert warnings == [] and fails == [
        "sglang-kernel 9.9 cannot run on sm_121 (some): CUDA error: no kernel image is available for execution on "
        "the device"
    ]
    assert report["problems"][0]["loading"] == {"kern/fast_ops.abi3.so": OPTIONAL, "kern/core_ops.abi3.so": IMPORT}
