"""A fake tree and test recipes for verify and guard --canary: each recipe rewrites one knob file
the fake OpenAI server (fake_openai_server.py) reads at start, so speed and answers depend on
bytes the journal wrote."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

from tests.unit.sglang_fakes import make_sglang

FAKE_SERVER = Path(__file__).with_name("fake_openai_server.py")
KNOBS = {
    "delay": "0.01",
    "mode": '"ok"',
    "crash": "False",
    "hang": "False",
    "stall": "False",
    "wire": '"ok"',
    "note": '"none"',
}
# recipe id -> (knob, new value, extra recipe lines)
RECIPES = {
    "fake-fast": ("delay", "0.003", ""),
    "fake-slow": ("delay", "0.04", ""),
    "fake-corrupt": ("mode", '"collapse"', 'changes_outputs = "tactics"\n'),
    "fake-late": ("mode", '"late"', 'changes_outputs = "kernels"\n'),
    "fake-crash": ("crash", "True", 'crash_signatures = ["FakeKernelError: the fake tactic has no image"]\n'),
    "fake-hang": ("hang", "True", ""),
    "fake-stall": ("stall", "True", ""),
    "fake-misfit": ("delay", "0.001", ""),  # its diff expects another release: it never applies
    "fake-badjson": ("wire", '"badjson"', ""),  # every completion chunk is not JSON
    "fake-noop": ("note", '"x"', ""),  # a knob the server does not read: changes nothing
    "fake-retune": ("delay", "0.005", 'changes_outputs = "tactics"\n'),  # another tactic: only the speed
    "fake-drift": ("mode", '"drift"', 'changes_outputs = "tactics"\n'),  # answers change after two
}
MISFIT_BEFORE = {"fake-misfit": "0.5"}
# recipes whose gate is a function with a [[taken]] anchor: the fake server calls every
# srt/verify_gates/reached*.py's gate() at start (the workload reaches it) and never the others
GATES = {"fake-reached": "reached", "fake-unreached": "unreached"}
GATE_BEFORE = "def gate():\n    return False\n"


def gate_rel(name: str) -> str:
    return f"srt/verify_gates/{name}.py"


def knob_rel(name: str) -> str:
    return f"srt/verify_knobs/{name}.py"


def make_tree(parent: Path) -> Path:
    """A fake SGLang 0.5.9 package with the knob files at their defaults; returns the package dir."""
    pkg = make_sglang(parent)
    for name, value in KNOBS.items():
        p = pkg / knob_rel(name)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"VALUE = {value}\n")
    for name in GATES.values():
        p = pkg / gate_rel(name)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(GATE_BEFORE)
    return pkg


def write_recipe(
    root: Path, rid: str, rel: str, name: str, title: str, hunk: str, head: str = "", tail: str = ""
) -> None:
    """One diff recipe in `root`/sglang for the file `rel`: `hunk` the diff's body after its header,
    `head`/`tail` TOML around [[edit]], `title` a TOML string as written."""
    (root / "sglang" / f"{rid}.diff").write_text(f"--- a/{rel}\n+++ b/{rel}\n{hunk}")
    (root / "sglang" / f"{rid}.toml").write_text(
        f'id = "{rid}"\npackage = "sglang"\ntitle = {title}\nwhy = "test data"\n'
        f'versions = ">=0"\narch = ["sm_120"]\n{head}\n[[edit]]\nname = "{name}"\ndiff = "{rid}.diff"\n{tail}'
    )


def make_recipes(root: Path) -> Path:
    """A recipe folder holding only the test recipes (and the shipped signature/kernel catalogues)."""
    from sm120patch.catalogue.recipes import default_recipe_dir

    (root / "sglang").mkdir(parents=True)
    for name in ("signatures.toml", "kernels.toml"):
        shutil.copy(default_recipe_dir() / name, root / name)
    for rid, (name, value, extra) in RECIPES.items():
        before = MISFIT_BEFORE.get(rid, KNOBS[name])
        hunk = f"@@ -1 +1 @@\n-VALUE = {before}\n+VALUE = {value}\n"
        write_recipe(root, rid, knob_rel(name), name, f"'test: {name} = {value}'", hunk, extra)
    for rid, name in GATES.items():
        hunk = "@@ -1,2 +1,2 @@\n def gate():\n-    return False\n+    return True\n"
        taken = '\n[[taken]]\nfunctions = ["gate"]\nanchor = "True"\nwhen = "the fake server calls gate()"\n'
        write_recipe(root, rid, gate_rel(name), name, f'"test: the {name} gate"', hunk, tail=taken)
    return root


_HELD: list[socket.socket] = []  # the reservations, open until the test process ends


def free_port() -> int:
    """A port no other process can take: bound here with SO_REUSEPORT and never listened on, so
    only the fake server (which binds with SO_REUSEPORT too, as this uid) can serve on it, and a
    connection finds no one until it does. Releasing the port before the server binds would let
    any process on a busy box take it in between."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return int(s.getsockname()[1])


def release_port(port: int) -> None:
    """Give a reserved port up (for a server that binds without SO_REUSEPORT, e.g. http.server)."""
    for s in [s for s in _HELD if s.getsockname()[1] == port]:
        _HELD.remove(s)
        s.close()


def server_command(pkg: Path, port: int, state: Path, *extra: str) -> list[str]:
    args = ["--port", str(port), "--package", str(pkg), "--state", str(state), *extra]
    return [sys.executable, "-u", str(FAKE_SERVER), *args]
