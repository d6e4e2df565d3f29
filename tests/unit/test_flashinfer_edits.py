"""The edit kinds the FlashInfer recipe uses, on small inputs written here (not upstream's code).

- widen-major-list: before/after texts, idempotence, satisfied and missing cases, params.
- diff edits (`plan._run_diff`): changed, satisfied when the reverse applies, missing when
  the context is not there or a file is absent, line ends kept, and all-or-nothing: a recipe
  with one piece that does not fit changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sm120patch.arch import parse_arch
from sm120patch.catalogue.recipes import load_recipe
from sm120patch.planning.plan import APPLICABLE, NOT_APPLICABLE, SATISFIED, plan
from sm120patch.planning.targets import discover
from sm120patch.transforms import TRANSFORMS
from sm120patch.transforms.widen_major_list import WidenMajorList
from tests.unit.transforms.helpers import assert_rewrites, assert_satisfied, assert_untouched, run

MAJORS = {"keyword": "supported_major_versions", "has": [9, 10], "add": 12}
GEN = ["gen_comm_module"]

# --- widen-major-list ---------------------------------------------------------------------------------------


def test_registered() -> None:
    assert TRANSFORMS["widen-major-list"] is WidenMajorList


def test_single_line_list_gains_the_major() -> None:
    assert_rewrites(
        WidenMajorList,
        MAJORS,
        GEN,
        """
        def gen_comm_module():
            flags = ctx.get_nvcc_flags_list(
                supported_major_versions=[9, 10]
            )
            return spec("comm", flags)
        """,
        """
        def gen_comm_module():
            flags = ctx.get_nvcc_flags_list(
                supported_major_versions=[9, 10, 12]
            )
            return spec("comm", flags)
        """,
    )


def test_trailing_comma_is_kept() -> None:
    assert_rewrites(
        WidenMajorList,
        MAJORS,
        GEN,
        "def gen_comm_module():\n    f(supported_major_versions=[9, 10,])\n",
        "def gen_comm_module():\n    f(supported_major_versions=[9, 10, 12,])\n",
    )


def test_one_per_line_stays_one_per_line() -> None:
    assert_rewrites(
        WidenMajorList,
        MAJORS,
        GEN,
        """
        def gen_comm_module():
            f(
                supported_major_versions=[
                    9,
                    10,  # Blackwell
                ],
            )
        """,
        """
        def gen_comm_module():
            f(
                supported_major_versions=[
                    9,
                    10,  # Blackwell
                    12,
                ],
            )
        """,
    )


def test_only_the_named_function_changes() -> None:
    """FlashInfer's comm.py has several generators with their own lists (0.6.14: four)."""
    assert_rewrites(
        WidenMajorList,
        MAJORS,
        GEN,
        """
        def gen_other_module():
            f(supported_major_versions=[9, 10])


        def gen_comm_module():
            f(supported_major_versions=[9, 10])
        """,
        """
        def gen_other_module():
            f(supported_major_versions=[9, 10])


        def gen_comm_module():
            f(supported_major_versions=[9, 10, 12])
        """,
    )


@pytest.mark.parametrize("lst", ["[9, 10, 12]", "[9, 10, 11, 12]", "[12, 9, 10]"])
def test_satisfied_when_the_major_is_there(lst: str) -> None:
    assert_satisfied(WidenMajorList, MAJORS, GEN, f"def gen_comm_module():\n    f(supported_major_versions={lst})\n")


@pytest.mark.parametrize(
    "code",
    [
        "def gen_comm_module():\n    f(supported_major_versions=MAJORS)\n",  # not a literal
        "def gen_comm_module():\n    f(supported_major_versions=[9, x])\n",  # not all ints
        "def gen_comm_module():\n    f(supported_major_versions=[10])\n",  # lacks an anchor
        "def gen_comm_module():\n    f(majors=[9, 10])\n",  # another keyword
        "def gen_comm_module():\n    f([9, 10])\n",  # positional
        "def gen_other_module():\n    f(supported_major_versions=[9, 10])\n",  # another function
    ],
)
def test_other_shapes_are_left_alone(code: str) -> None:
    assert_untouched(WidenMajorList, MAJORS, GEN, code)


def test_missing_reason_names_the_function_and_the_shape() -> None:
    t = WidenMajorList(MAJORS, GEN)
    t.apply(__import__("libcst").parse_module("def unrelated():\n    pass\n"))
    assert t.describe_missing() == "no gen_comm_module() in this release"
    t.apply(__import__("libcst").parse_module("def gen_comm_module():\n    f(supported_major_versions=M)\n"))
    assert "supported_major_versions=[...]" in t.describe_missing() and "9, 10" in t.describe_missing()
    assert t.needles() == ["def gen_comm_module("]


def test_without_has_any_int_list_counts() -> None:
    params = {"keyword": "supported_major_versions", "add": 12}
    out = run(WidenMajorList, params, GEN, "def gen_comm_module():\n    f(supported_major_versions=[10])\n")
    assert out.changed == 1 and out.module is not None and "[10, 12]" in out.module.code


@pytest.mark.parametrize(
    ("params", "functions", "fragment"),
    [
        ({**MAJORS, "extra": 1}, GEN, "unknown param"),
        ({"has": [9], "add": 12}, GEN, "'keyword' is missing"),
        ({"keyword": "k", "has": [9]}, GEN, "'add' is missing"),
        ({**MAJORS, "add": "12"}, GEN, "'add' must be an integer"),
        ({**MAJORS, "add": True}, GEN, "'add' must be an integer"),
        ({**MAJORS, "has": ["9"]}, GEN, "'has' must be a list of integers"),
        ({**MAJORS, "has": 9}, GEN, "'has' must be a list of integers"),
        (MAJORS, [], "'functions'"),
    ],
)
def test_check_params(params: dict[str, Any], functions: list[str], fragment: str) -> None:
    problem = WidenMajorList.check_params(params, functions)
    assert problem and fragment in problem and "\n" not in problem


# --- diff edits -------------------------------------------------------------------------------------------

HEADER = "lib/kernels.cuh"
BEFORE = """\
#pragma once
__global__ void k() {
#if (defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && (__CUDA_ARCH__ < 1200))
  work();
#endif
}
"""
AFTER = BEFORE.replace(" && (__CUDA_ARCH__ < 1200)", "")
DIFF = f"""\
Commentary before the first header is ignored by git apply.

--- a/data/{HEADER}
+++ b/data/{HEADER}
@@ -1,6 +1,6 @@
 #pragma once
 __global__ void k() {{
-#if (defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && (__CUDA_ARCH__ < 1200))
+#if (defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900))
   work();
 #endif
 }}
"""
COMM = "from .core import f\n\n\ndef gen_comm_module():\n    f(supported_major_versions=[9, 10])\n"
RECIPE = """\
id = "fi"
package = "flashinfer"
title = "t"
why = "w"
versions = ">=0.5.0"
arch = ["sm_120", "sm_121"]

[[edit]]
name = "jit-gate"
transform = "widen-major-list"
functions = ["gen_comm_module"]
files = ["jit/comm.py"]
params = { keyword = "supported_major_versions", has = [9, 10], add = 12 }

[[edit]]
name = "kernel-bodies"
diff = "bodies.diff"
"""


def fake_flashinfer(root: Path, header: str | bytes = BEFORE, comm: str = COMM) -> Path:
    pkg = root / "flashinfer"
    (pkg / "jit").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_build_meta.py").write_text('__version__ = "0.6.1"\n')
    (pkg / "jit" / "comm.py").write_text(comm)
    h = pkg / "data" / HEADER
    h.parent.mkdir(parents=True)
    h.write_bytes(header.encode() if isinstance(header, str) else header)
    return root


def plan_one(tmp_path: Path, tree: Path, diff: str = DIFF):
    recipes = tmp_path / "recipes" / "flashinfer"
    recipes.mkdir(parents=True, exist_ok=True)
    (recipes / "fi.toml").write_text(RECIPE)
    (recipes / "bodies.diff").write_text(diff)
    (target,) = discover(tree, "flashinfer")
    (p,) = plan(target, [load_recipe(recipes / "fi.toml")], parse_arch("sm_120"))
    return p


def test_diff_and_transform_change_together(tmp_path: Path) -> None:
    p = plan_one(tmp_path, fake_flashinfer(tmp_path / "t"))
    assert p.status == APPLICABLE, p.reason
    assert {e.name: e.outcome for e in p.edits} == {"jit-gate": "changed", "kernel-bodies": "changed"}
    assert p.changes[f"flashinfer/data/{HEADER}"] == (BEFORE.encode(), AFTER.encode())
    assert p.changes["flashinfer/jit/comm.py"][1] == COMM.replace("[9, 10]", "[9, 10, 12]").encode()
    assert f"+++ b/flashinfer/data/{HEADER}" in p.diff()


def test_satisfied_when_the_reverse_applies(tmp_path: Path) -> None:
    tree = fake_flashinfer(tmp_path / "t", AFTER, COMM.replace("[9, 10]", "[9, 10, 12]"))
    p = plan_one(tmp_path, tree)
    assert p.status == SATISFIED and not p.changes
    assert {e.outcome for e in p.edits} == {"satisfied"}


def test_crlf_line_ends_are_kept(tmp_path: Path) -> None:
    crlf = BEFORE.replace("\n", "\r\n").encode()
    diff = DIFF.replace("\n", "\r\n").replace("Commentary before the first header is ignored by git apply.\r\n\r\n", "")
    p = plan_one(tmp_path, fake_flashinfer(tmp_path / "t", crlf), diff)
    assert p.status == APPLICABLE, p.reason
    assert p.changes[f"flashinfer/data/{HEADER}"][1] == AFTER.replace("\n", "\r\n").encode()


def test_one_piece_missing_leaves_everything_untouched(tmp_path: Path) -> None:
    """The gate alone must never be widened: kernels with empty bodies return garbage."""
    other = BEFORE.replace("work();", "other_work();")
    p = plan_one(tmp_path, fake_flashinfer(tmp_path / "t", other))
    assert p.status == NOT_APPLICABLE and not p.changes
    assert "bodies.diff does not apply" in p.reason
    assert {e.name: e.outcome for e in p.edits} == {"jit-gate": "changed", "kernel-bodies": "missing"}


def test_gate_opened_by_hand_still_gets_the_kernel_fix(tmp_path: Path) -> None:
    """A by-hand edit of comm.py alone builds empty kernels: the recipe finishes the job."""
    tree = fake_flashinfer(tmp_path / "t", comm=COMM.replace("[9, 10]", "[9, 10, 12]"))
    p = plan_one(tmp_path, tree)
    assert p.status == APPLICABLE and p.files == [f"flashinfer/data/{HEADER}"]
    assert {e.name: e.outcome for e in p.edits} == {"jit-gate": "satisfied", "kernel-bodies": "changed"}


def test_file_not_in_release_is_missing(tmp_path: Path) -> None:
    tree = fake_flashinfer(tmp_path / "t")
    (tree / "flashinfer" / "data" / HEADER).unlink()
    p = plan_one(tmp_path, tree)
    assert p.status == NOT_APPLICABLE and f"data/{HEADER} not in this release" in p.reason
