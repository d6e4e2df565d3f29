"""The shortcuts behind `plan`'s speed give the answers of the slow ways (no timing here).

- `find_functions` walks statements only, yet finds what a full libcst visitor finds;
- `replace_nodes` rebuilds only the way down to the swapped nodes, yet yields the code a
  full transformer yields, and falls back to the full walk for a node it was not told of;
- the package scan answers every edit's needles from one pass, as a per-needle scan would;
- `plan_statuses` (pre-flight's plan-result cache) returns what `plan` returns, and
  recomputes when a file it read, a hinted path, the package listing, the archs or the
  journal's applied set change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest

import sm120patch
from sm120patch.arch import parse_arch
from sm120patch.catalogue.recipes import load_recipes
from sm120patch.planning import plan as plan_mod
from sm120patch.planning import plan_cache
from sm120patch.planning.locate import PackageIndex
from sm120patch.planning.plan import plan
from sm120patch.planning.plan_cache import plan_statuses
from sm120patch.planning.targets import discover
from sm120patch.transforms.rewrite import find_functions, find_ifs, replace_nodes
from tests.unit.sglang_fakes import ALLREDUCE, AUTOTUNE, MOE, SERVER_ARGS_REL, make_sglang

NESTED = """\
import sys


def f():
    def f():
        return a or b

    return f


class C:
    def f(self):
        if x:
            def f():
                pass
        return [1, 2]

    @property
    def g(self):
        return c or d


if sys.version_info > (3,):
    def f():
        pass
else:
    try:
        def f():
            pass
    except ValueError:
        def f():
            pass
    else:
        def f():
            pass
    finally:
        def f():
            pass

with open("x") as h:
    for i in range(3):
        def f():
            pass
    else:
        def f():
            pass
    while True:
        def f():
            pass

try:
    pass
except* TypeError:
    def f():
        pass

match sys.argv:
    case [_, "a"]:
        def f():
            pass
    case _:
        async def f():
            pass
"""


def _visitor_functions(module: cst.Module, names: set[str]) -> list[cst.FunctionDef]:
    found: list[cst.FunctionDef] = []

    class V(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            if node.name.value in names:
                found.append(node)

    module.visit(V())
    return found


def test_find_functions_matches_a_full_visitor() -> None:
    module = cst.parse_module(NESTED)
    for names in ({"f"}, {"g"}, {"f", "g"}, {"nope"}):
        located = find_functions(module, sorted(names))
        assert [fn for fn, _ in located] == _visitor_functions(module, names)
        for fn, chain in located:
            assert chain[0] is module
            for parent, child in zip(chain, (*chain[1:], fn), strict=True):
                assert any(c is child for c in parent.children)


IFS = """\
def h(x):
    if a:
        if b:
            pass
        elif c:
            if d: pass
        else:
            pass
    try:
        if e:
            pass
    except* ValueError:
        if f:
            pass
    else:
        if g:
            pass
    finally:
        if k:
            pass
    with m:
        for i in x:
            if n:
                pass
        else:
            if o:
                pass
        while p:
            if q:
                pass
    match x:
        case 1:
            if r:
                pass
    class C:
        if s:
            pass

        @deco(lambda: t if u else v)
        def inner(self, y=(w if z else 0)):
            if y:
                return [j for j in y if j]
    return (lambda: aa if bb else cc)()


def one_line(): return 1 if x else 2
"""


def _visitor_ifs(fn: cst.FunctionDef) -> list[cst.If]:
    found: list[cst.If] = []

    class V(cst.CSTVisitor):
        def visit_If(self, node: cst.If) -> None:
            found.append(node)

    fn.body.visit(V())
    return found


def test_find_ifs_matches_a_full_visitor() -> None:
    """The statement walk finds every `if` a visitor does, the same nodes in the same order
    (add_condition and narrow_arch_test use it; a visitor rebuilt every node of the body)."""
    for source in (IFS, NESTED):
        module = cst.parse_module(source)
        fns = [fn for fn, _ in find_functions(module, ["h", "one_line", "f", "g", "inner"])]
        assert any(_visitor_ifs(fn) for fn in fns)
        for fn in fns:
            assert [id(n) for n in find_ifs(fn)] == [id(n) for n in _visitor_ifs(fn)]
    assert len(find_ifs(find_functions(cst.parse_module(IFS), ["h"])[0][0])) == 14  # a b c d e f g k n o q r s y


def _full_swap(module: cst.Module, mapping: dict[cst.CSTNode, cst.CSTNode]) -> cst.Module:
    class T(cst.CSTTransformer):
        def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
            return mapping.get(original, updated)

    return module.visit(T())


def _nodes(module: cst.Module, kind: type) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []

    class V(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, kind):
                found.append(node)
            return True

    module.visit(V())
    return found


def test_replace_nodes_equals_a_full_transformer() -> None:
    module = cst.parse_module(NESTED)
    located = find_functions(module, ["f", "g"])
    ors = _nodes(module, cst.BooleanOperation)
    lists = _nodes(module, cst.List)
    assert len(ors) == 2 and len(lists) == 1
    cases = [
        {ors[0]: cst.parse_expression("a or b or e")},
        {ors[1]: cst.parse_expression("(c or d or e)"), lists[0]: cst.parse_expression("[1, 2, 3]")},
        {located[2][0]: located[2][0].with_changes(name=cst.Name("renamed"))},
    ]
    for mapping in cases:
        fast = replace_nodes(module, dict(mapping), located)
        assert fast.code == _full_swap(module, dict(mapping)).code != module.code
    # a node outside the located functions: the full walk still swaps it
    imp = _nodes(module, cst.Import)[0]
    new_imp = cst.parse_statement("import os\n").body[0]
    assert replace_nodes(module, {imp: new_imp}, located).code.startswith("import os\n")
    # without `located` (module-level swaps): the way down is read off the fields, the rest is shared
    for mapping in [*cases, {imp: new_imp}]:
        fast = replace_nodes(module, dict(mapping), None)
        assert fast.code == _full_swap(module, dict(mapping)).code != module.code
    fast = replace_nodes(module, {imp: new_imp}, None)
    assert fast.body[-1] is module.body[-1]  # a statement off the way down is the very same node


def test_one_scan_answers_every_needle(tmp_path: Path) -> None:
    pkg = make_sglang(tmp_path)
    (pkg / "srt" / "extra.py").write_text("def _resolve_backend(x):\n    return x\nasync def other(y):\n    pass\n")
    (pkg / "tests").mkdir()
    (pkg / "tests" / "t.py").write_text("def _resolve_backend():\n    pass\n")
    (target,) = discover(tmp_path)
    needles = ["def _resolve_backend(", "def other(", "class ServerArgs", "def missing("]
    together = PackageIndex(target)
    together.expect(needles)
    for n in needles:
        one = PackageIndex(target)
        want = [p for p in one.files() if n.encode() in p.read_bytes()]
        assert together.containing([n]) == want == one.containing([n])
    assert together.containing(needles[:2]) == sorted(
        {*together.containing(needles[:1]), *together.containing(needles[1:2])}
    )
    assert not any("tests" in p.parts for p in together.files())


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    make_sglang(tmp_path / "tree")
    return tmp_path / "tree"


def _summary(plans: list) -> list[tuple]:
    return [(p.recipe.id, p.status, p.reason, [e.to_dict() for e in p.edits]) for p in plans]


def _count_plans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = plan_mod._plan

    def counting(*a, **k):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(plan_mod, "_plan", counting)  # what plan() runs
    monkeypatch.setattr(plan_cache, "_plan", counting)  # what plan_statuses() runs
    return calls


def _bump(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def _status_map(summary: list[tuple]) -> dict[str, str]:
    return {rid: status for rid, status, _reason, _edits in summary}


def _in_another_process(tree: Path, arch: str, cache: Path) -> dict[str, str]:
    """`sm120patch plan --json` in a fresh process with an empty cache: no state shared with this one."""
    r = subprocess.run(
        [sys.executable, "-m", "sm120patch", "plan", str(tree), "--arch", arch, "--probe", "none", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
    )
    assert r.returncode in (0, 1), r.stderr
    return {x["id"]: x["status"] for x in json.loads(r.stdout)["recipes"]}


def test_plan_statuses_cache(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    recipes = load_recipes()
    (target,) = discover(tree)
    sm120, sm121 = parse_arch("sm_120"), parse_arch("sm_121")
    fresh = _summary(plan(target, recipes, sm120))
    calls = _count_plans(monkeypatch)

    def statuses(arch=sm120, applied=None):  # type: ignore[no-untyped-def]
        return _summary(plan_statuses(target, recipes, arch, applied=applied, cache_dir=cache))

    # the oracles: what the fake tree holds, by hand (its three gates, nothing of the frontier recipes),
    # and a plan in another process with an empty cache
    hand = {**dict.fromkeys((r.id for r in recipes if r.package == "sglang"), "not-applicable")}
    hand.update(dict.fromkeys((ALLREDUCE, AUTOTUNE, MOE), "applicable"))
    assert _status_map(statuses()) == hand == _in_another_process(tree, "sm_120", tmp_path / "fresh-1")
    assert statuses() == fresh and calls[0] == 1
    assert statuses() == fresh and calls[0] == 1  # served from the cache
    assert _status_map(statuses()) == hand
    assert statuses(sm121) and calls[0] == 2  # another arch, another entry
    assert statuses(applied={ALLREDUCE: "applied x"})[0][1] == "applied" and calls[0] == 3

    # a file the plan parsed changes: recompute (here the MoE rule is now upstream's own)
    server_args = tree / SERVER_ARGS_REL
    text = server_args.read_text()
    _bump(
        server_args,
        text.replace(
            '"""Choose the MoE runner backend."""',
            '"""Choose the MoE runner backend."""\n        if is_sm120_supported():\n'
            '            self.moe_runner_backend = "flashinfer_cutlass"',
        ).replace("is_sm100_supported\n", "is_sm100_supported, is_sm120_supported\n"),
    )
    changed = statuses()
    assert calls[0] == 4 and changed != fresh
    hand[MOE] = "satisfied"  # the tree now does what the MoE recipe would
    assert _status_map(changed) == hand == _in_another_process(tree, "sm_120", tmp_path / "fresh-2")
    assert changed == _summary(plan(target, recipes, sm120)) and calls[0] == 5
    assert statuses() == changed and calls[0] == 5

    # the package gains a file that a required edit not found in its hints searches for
    # (the FP4 recipe's `fp4_gemm`, which this fake tree does not have where the recipe looks)
    (tree / "sglang" / "srt" / "layers" / "fp4_moved.py").write_text(
        "def fp4_gemm(x, backend):\n    return flashinfer_fp4_gemm(x, backend=backend)\n"
    )
    again = statuses()
    assert calls[0] == 6 and again != changed
    assert _status_map(again) == _in_another_process(tree, "sm_120", tmp_path / "fresh-3")
    assert again == _summary(plan(target, recipes, sm120)) and calls[0] == 7
    # a hinted file that did not exist appears: recompute
    hinted = tree / "sglang" / "srt" / "arg_groups" / "overrides.py"
    hinted.parent.mkdir()
    hinted.write_text("x = 1\n")
    statuses()
    assert calls[0] == 8

    # rewritten with the same bytes (an apply rolled back): new inode and mtime, still cached
    def rewrite(f: Path) -> None:
        data = f.read_bytes()
        f.unlink()
        f.write_bytes(data)
        st = f.stat()
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))

    before = calls[0]
    rewrite(server_args)  # a file the plan parsed: its sha256 vouches for it
    statuses()
    assert calls[0] == before
    rewrite(tree / "sglang" / "srt" / "utils.py")  # only scanned: no sha256 kept, so recompute
    statuses()
    assert calls[0] == before + 1
    _bump(server_args, server_args.read_text().replace("fp8", "fp9"))  # same size, other bytes
    statuses()
    assert calls[0] == before + 2


def test_an_optional_edit_looks_in_its_hinted_files_only(tree: Path) -> None:
    """The allreduce backend resolver (optional) outside its hinted file is not searched for:
    a package scan per absent optional part would cost more than the rest of the plan."""
    (tree / "sglang" / "srt" / "layers" / "comm_backends.py").write_text(
        "def _resolve_backend(self):\n    if _is_sm90_supported or _is_sm100_supported:\n        return 1\n"
    )
    (target,) = discover(tree)
    (p,) = [p for p in plan(target, load_recipes(), parse_arch("sm_120")) if p.recipe.id == ALLREDUCE]
    assert {e.name: e.outcome for e in p.edits}["backend-resolver"] == "missing"
    assert "sglang/srt/layers/comm_backends.py" not in p.files


def test_the_cache_key_stamps_every_module_of_the_package() -> None:
    """An edited planner, transform or catalogue reader must invalidate cached statuses, wherever the
    module lives in the package (the layout move put plan_cache.py one folder down; the stamp then
    covered planning/ alone)."""
    package = Path(sm120patch.__file__).resolve().parent
    stamped = {name for name, _ in plan_cache._tool_stamp()}
    on_disk = {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    assert stamped == on_disk
    assert {"planning/plan.py", "transforms/base.py", "catalogue/recipes.py", "status.py"} <= stamped
