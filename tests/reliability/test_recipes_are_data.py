"""Recipes are data: Python in a recipe's strings is never run, and nothing in the recipe folder
is ever imported or executed (checked with an audit hook in a real process)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from sm120patch.catalogue.recipes import default_recipe_dir
from tests.reliability.conftest import count, fingerprint, make_fake

AR = "sglang-allreduce-fusion-sm120"

PROBE = textwrap.dedent(
    """
    import json, sys
    recipes, tree, log = sys.argv[1], sys.argv[2], sys.argv[3]
    seen = {"exec": [], "import": [], "open": []}

    def hook(event, args):
        if event == "exec":
            seen["exec"].append(getattr(args[0], "co_filename", "?"))
        elif event == "import" and args[1]:
            seen["import"].append(str(args[1]))
        elif event == "open" and isinstance(args[0], str) and args[0].startswith(recipes):
            seen["open"].append([args[0], str(args[1])])

    sys.addaudithook(hook)
    from sm120patch.cli import main
    codes = []
    for argv in (["recipes", "--recipes", recipes],
                 ["plan", tree, "--arch", "sm_120", "--probe", "none", "--recipes", recipes],
                 ["apply", tree, "--arch", "sm_120", "--probe", "none", "--recipes", recipes],
                 ["rollback", tree, "--recipes", recipes]):
        try:
            main(argv)
        except SystemExit as e:
            codes.append(e.code)
    seen["codes"] = codes
    open(log, "w").write(json.dumps(seen))
    """
)


def test_code_in_recipe_strings_and_files_is_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    evil = f"__import__('os').system('touch {marker}')"
    recipes = tmp_path / "recipes"
    shutil.copytree(default_recipe_dir(), recipes)
    path = recipes / "sglang" / f"{AR}.toml"
    text = path.read_text()
    text = text.replace('title = "', f'title = "{{{{{evil}}}}} ', 1)
    text = text.replace('why = """', f'why = """\n{evil}\n', 1)
    text = text.replace('advice = """', f'advice = """\n{evil}\n', 1)
    path.write_text(text)
    moe = recipes / "sglang" / "sglang-moe-backend-sm120.toml"
    moe.write_text(moe.read_text().replace("# sm120patch: trtllm-gen", f"# {evil}\n    # sm120patch: trtllm-gen"))
    for name in ("__init__.py", "conftest.py", "sglang/__init__.py", "sglang/evil.py", "setup.py"):
        (recipes / name).write_text(f"{evil}\n")
    (recipes / "sglang" / "evil.toml.py").write_text(f"{evil}\n")
    tree = make_fake(tmp_path / "tree")
    before = fingerprint(tree)
    log = tmp_path / "audit.json"
    r = subprocess.run(
        [sys.executable, "-c", PROBE, str(recipes), str(tree), str(log)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    seen = json.loads(log.read_text())
    assert seen["codes"][0] in (0, None) and seen["codes"][1] in (0, 1) and seen["codes"][2] in (0, 1), seen["codes"]
    assert not marker.exists()
    assert not [f for f in seen["exec"] if f.startswith(str(recipes)) or f.startswith(str(tree))]
    assert not [f for f in seen["import"] if f.startswith(str(recipes))]
    opened = {Path(p).name for p, _ in seen["open"]}
    assert opened and all(n.endswith((".toml", ".diff")) for n in opened), opened
    assert all(mode in ("r", "rb") for _, mode in seen["open"]), seen["open"]
    # the inserted rule is data written into the tree, and rollback takes it out again
    assert fingerprint(tree) == before
    count("recipes_as_data_cases")
