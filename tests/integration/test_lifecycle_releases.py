"""The life a pip user leads (issue 19): SGLang and FlashInfer in one site-packages made by
`python -m venv` + `pip install --no-deps`, patched, then changed by pip under the journal.

Every check is on bytes, against the wheels themselves (the oracle is PyPI's wheel, never the
code under test): no file of another release is ever written into a package; the SGLang
allreduce gate is never left open over a stock FlashInfer 0.6.3; exit 2 leaves the tree
byte-identical; nothing exits 3. One venv per release pair is built once (offline after the
first download) under the shared cache and copied per test.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import needs_tool, requires, unavailable
from tools import releases

pytestmark = pytest.mark.releases

CLI = [sys.executable, "-m", "sm120patch"]
AR, FIX = "sglang-allreduce-fusion-sm120", "flashinfer-trtllm-comm-sm120"
PY = f"python{sys.version_info[0]}.{sys.version_info[1]}"
COMMON = ["--arch", "sm_120", "--probe", "static"]


def sm(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode != 3 and "Traceback" not in r.stderr, r.stderr  # never an internal error
    return r


def wheel(package: str, version: str) -> Path:
    try:
        return releases.wheel(package, version)
    except RuntimeError as e:
        unavailable(str(e))


def wheel_files(package: str, version: str) -> dict[str, bytes]:
    """The release's own bytes, package files only (the oracle)."""
    top = {"sglang": "sglang/", "flashinfer": "flashinfer/"}[package]
    with zipfile.ZipFile(wheel(package, version)) as z:
        return {n: z.read(n) for n in z.namelist() if n.startswith(top) and not n.endswith("/")}


def pip_venv(sglang: str, fi: str) -> Path:
    """A venv with both wheels pip-installed (no deps, no bytecode), built once and shared."""
    venv = releases.cache_dir() / "pypi" / "venvs" / f"lifecycle-sg{sglang}-fi{fi}-{PY}"
    if (venv / ".ready").is_file():
        return venv
    wheels = [wheel("sglang", sglang), wheel("flashinfer", fi)]
    tmp = venv.with_name(f".{venv.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True, timeout=300)
    # pip from this interpreter installs into the venv's site-packages, as `pip install` in it would
    r = pip(tmp, *map(str, wheels))
    if r.returncode != 0:
        unavailable(f"cannot build the lifecycle venv: {r.stderr.strip()[-400:]}")
    (tmp / ".ready").write_text("")
    try:
        os.rename(tmp, venv)
    except OSError:  # another run built it first
        shutil.rmtree(tmp, ignore_errors=True)
    return venv


def pip(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps"]
    cmd += ["--no-compile", "--disable-pip-version-check", "--no-index", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def replace(path: Path, text: str) -> None:
    """A hand edit as editors save: a new file, never a write through the hard link to the cache."""
    path.unlink()
    path.write_text(text)


def site_of(venv: Path) -> Path:
    return venv / "lib" / PY / "site-packages"


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A private copy of the 0.5.9 + 0.6.3 venv (SGLang 0.5.9 pins FlashInfer 0.6.3): hard links,
    safe because sm120patch and pip replace files (a new inode), and so do the hand edits here."""
    src = pip_venv("0.5.9", "0.6.3")
    dest = tmp_path / "venv"
    subprocess.run(["cp", "-al", str(src), str(dest)], check=True)
    return dest


def tree(site: Path, package: str) -> dict[str, bytes]:
    out = {}
    for p in (site / package).rglob("*"):
        if p.is_file() and "__pycache__" not in p.parts:
            out[p.relative_to(site).as_posix()] = p.read_bytes()
    return out


def everything(site: Path) -> dict[str, tuple[str, int]]:
    """Every file and link under site-packages: (sha256 or link target, mode)."""
    out = {}
    for p in sorted(site.rglob("*")):
        st = p.lstat()
        if p.is_symlink():
            out[p.relative_to(site).as_posix()] = (os.readlink(p), st.st_mode)
        elif p.is_file():
            out[p.relative_to(site).as_posix()] = (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mode)
    return out


def diff_from_release(site: Path, package: str, version: str) -> list[str]:
    want, have = wheel_files(package, version), tree(site, package)
    return sorted(k for k in want.keys() | have.keys() if want.get(k) != have.get(k))


def gate_safe(site: Path, fi_version: str) -> None:
    """The invariant: an opened allreduce gate stands on a FlashInfer whose comm gate is opened too."""
    stock_comm = wheel_files("flashinfer", fi_version)["flashinfer/jit/comm.py"]
    comm = (site / "flashinfer/jit/comm.py").read_bytes()
    stock_sg = wheel_files("sglang", "0.5.9").get("sglang/srt/layers/communicator.py")
    opened = (site / "sglang/srt/layers/communicator.py").read_bytes() != stock_sg
    assert not (opened and comm == stock_comm), "allreduce gate open over a stock FlashInfer"


def journal(site: Path) -> dict:
    path = site / ".sm120patch" / "journal.json"
    return json.loads(path.read_text()) if path.exists() else {"applied": []}


def applied(site: Path) -> list[str]:
    return [a["id"] for a in journal(site)["applied"]]


def test_rolling_back_the_flashinfer_recipe_in_one_site_takes_its_dependent_first(venv: Path) -> None:
    site = site_of(venv)
    # the package folders named: still the site's one journal (bug 11)
    assert sm("apply", site / "sglang", site / "flashinfer", *COMMON, "--ok-blocked").returncode == 0
    assert not (site / "sglang" / ".sm120patch").exists() and not (site / "flashinfer" / ".sm120patch").exists()
    assert {AR, FIX} <= set(applied(site))
    r = sm("rollback", site, "--recipe", FIX, "--json")
    assert r.returncode == 0, r.stderr
    assert AR not in applied(site) and FIX not in applied(site)
    assert diff_from_release(site, "flashinfer", "0.6.3") == []
    stock = wheel_files("sglang", "0.5.9")
    assert (site / "sglang/srt/layers/communicator.py").read_bytes() == stock["sglang/srt/layers/communicator.py"]
    gate_safe(site, "0.6.3")


def test_guard_rolls_the_flashinfer_recipe_back_in_one_site(venv: Path) -> None:
    """guard's hook (`engine.rollback_recipes`) sees every package of the site, and the dependents."""
    from sm120patch.engine.tree import rollback_recipes

    site = site_of(venv)
    assert sm("apply", site, *COMMON, "--ok-blocked").returncode == 0
    done = rollback_recipes(site, [FIX, "sglang-no-such"])
    assert set(done) == {FIX, AR} and "not applied" in done.reasons["sglang-no-such"]
    assert diff_from_release(site, "flashinfer", "0.6.3") == []
    gate_safe(site, "0.6.3")


def test_force_reinstall_of_flashinfer_is_seen_by_status_apply_and_rollback(venv: Path) -> None:
    """pip puts FlashInfer 0.6.3's own bytes back over the backport: status says `replaced-by-pip`;
    apply patches both again (the SGLang gate standing on it included); after a second reinstall,
    rollback needs no --force and leaves both releases' bytes."""
    site = site_of(venv)
    r = sm("apply", site, *COMMON, "--ok-blocked")
    assert r.returncode == 0 and {FIX, AR} <= set(applied(site)), (r.stdout, r.stderr)
    patched = tree(site, "sglang"), tree(site, "flashinfer")
    assert pip(venv, "--force-reinstall", str(wheel("flashinfer", "0.6.3"))).returncode == 0
    st = json.loads(sm("status", site, "--json").stdout)
    states = {a["id"]: a["state"] for t in st["targets"] for a in t["applied"]}
    assert states[FIX] == "replaced-by-pip"
    from sm120patch.engine.tree import applied_recipes

    assert FIX not in applied_recipes(site) and AR in applied_recipes(site)  # what guard's diagnosis sees
    r = sm("apply", site, *COMMON, "--ok-blocked", "--json")
    assert r.returncode == 0, r.stderr
    assert (tree(site, "sglang"), tree(site, "flashinfer")) == patched  # both patched again, as the first time
    gate_safe(site, "0.6.3")
    assert pip(venv, "--force-reinstall", str(wheel("flashinfer", "0.6.3"))).returncode == 0
    r = sm("rollback", site, "--json")  # no --force needed: pip's bytes are the originals
    assert r.returncode == 0, r.stderr
    assert diff_from_release(site, "flashinfer", "0.6.3") == [] and diff_from_release(site, "sglang", "0.5.9") == []
    assert not (site / ".sm120patch").exists()


def test_force_reinstall_of_sglang_then_apply_plans_afresh(venv: Path) -> None:
    site = site_of(venv)
    assert sm("apply", site, *COMMON, "--ok-blocked").returncode == 0
    patched = tree(site, "sglang")
    assert pip(venv, "--force-reinstall", str(wheel("sglang", "0.5.9"))).returncode == 0
    assert diff_from_release(site, "sglang", "0.5.9") == []
    r = sm("apply", site, *COMMON, "--ok-blocked", "--json")
    assert r.returncode == 0, r.stderr
    assert tree(site, "sglang") == patched
    assert sm("rollback", site).returncode == 0
    assert diff_from_release(site, "sglang", "0.5.9") == [] and diff_from_release(site, "flashinfer", "0.6.3") == []


def test_downgrade_and_upgrade_of_sglang_never_get_the_other_releases_bytes(venv: Path) -> None:
    site = site_of(venv)
    assert sm("apply", site, *COMMON, "--ok-blocked").returncode == 0
    assert pip(venv, str(wheel("sglang", "0.5.8"))).returncode == 0
    st = json.loads(sm("status", site, "--json").stdout)
    sg = next(t for t in st["targets"] if t["target"]["package"] == "sglang")
    assert sg["applied"] and {a["state"] for a in sg["applied"]} == {"other-release"}
    r = sm("rollback", site, "--force", "--json")
    assert r.returncode == 0, r.stderr
    assert diff_from_release(site, "sglang", "0.5.8") == []  # not one 0.5.9 byte written into 0.5.8
    assert diff_from_release(site, "flashinfer", "0.6.3") == []
    r = sm("apply", site, *COMMON, "--ok-blocked", "--json")  # 0.5.8 planned afresh
    assert r.returncode == 0, r.stderr
    assert {a["version"] for a in journal(site)["applied"] if a["package"] == "sglang"} == {"0.5.8"}
    assert pip(venv, str(wheel("sglang", "0.5.9"))).returncode == 0  # and the upgrade back
    assert sm("rollback", site, "--force").returncode == 0
    assert diff_from_release(site, "sglang", "0.5.9") == []  # not one 0.5.8 byte written into 0.5.9


def test_upgrade_then_downgrade_of_flashinfer_never_leaves_the_gate_over_a_stock_one(venv: Path) -> None:
    """0.6.3 + backport -> pip 0.6.17 (SM12x kernels of its own) -> apply -> pip 0.6.1 (none) -> apply:
    the backport is never written into 0.6.17, 0.6.17's bytes never into 0.6.1, and the allreduce
    gate is never left open over a stock FlashInfer older than 0.6.17."""
    site = site_of(venv)
    assert sm("apply", site, *COMMON, "--ok-blocked").returncode == 0
    assert pip(venv, str(wheel("flashinfer", "0.6.17"))).returncode == 0
    r = sm("apply", site, *COMMON, "--ok-blocked", "--json")
    assert r.returncode in (0, 1), r.stderr
    assert diff_from_release(site, "flashinfer", "0.6.17") == []  # the 0.6.3 backport is not written into 0.6.17
    assert FIX not in applied(site)
    assert pip(venv, str(wheel("flashinfer", "0.6.1"))).returncode == 0
    r = sm("apply", site, *COMMON, "--ok-blocked", "--json")
    assert r.returncode in (0, 1), r.stderr
    gate_safe(site, "0.6.1")
    ours = {rel for a in journal(site)["applied"] if a["package"] == "flashinfer" for rel in a["files"]}
    assert set(diff_from_release(site, "flashinfer", "0.6.1")) <= ours  # only our own recipes' files differ
    assert sm("rollback", site, "--force").returncode == 0
    assert diff_from_release(site, "flashinfer", "0.6.1") == [] and diff_from_release(site, "sglang", "0.5.9") == []


@pytest.mark.parametrize(
    "extra",
    [
        ["--arch", "sm_90"],
        ["--arch", "sm_100"],
        ["--arch", "sm_120", "--recipe", "sglang-fp4-gemm-b12x-sm120"],
        ["--arch", "sm_120", "--recipe", "sglang-gdn-prefill-sm120"],
    ],
)
def test_apply_that_writes_nothing_on_a_site_holding_both(venv: Path, extra: list[str]) -> None:
    site = site_of(venv)
    before = everything(site)
    r = sm("apply", site, "--probe", "static", *extra)
    assert r.returncode in (0, 1), r.stderr  # bug 3 was exit 3 (FileNotFoundError in remove_if_empty)
    assert everything(site) == before and not (site / ".sm120patch").exists()


def test_exit_2_after_flashinfer_was_written_leaves_the_site_byte_identical(venv: Path) -> None:
    """`sglang/` a symlink (bug 4): SGLang's write is refused after FlashInfer's six files were
    written; the command puts them back before it exits 2."""
    site = site_of(venv)
    real = venv / "sglang-elsewhere"
    shutil.move(site / "sglang", real)
    (site / "sglang").symlink_to(real, target_is_directory=True)
    before = everything(site), everything(real)
    trace = venv / "trace"
    r = sm("apply", site, *COMMON, env={**os.environ, "SM120PATCH_FAULT_TRACE": str(trace)})
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "symlink" in r.stderr
    assert "\treplaced comm.py" in trace.read_text()  # FlashInfer's files were written before the refusal
    assert (everything(site), everything(real)) == before and not (site / ".sm120patch").exists()


@pytest.mark.parametrize("step", [3, 25])
def test_ctrl_c_during_the_writes_puts_every_byte_back(venv: Path, step: int) -> None:
    site = site_of(venv)
    before = everything(site)
    env = {**os.environ, "SM120PATCH_FAULT": f"int:{step}"}
    r = sm("apply", site, *COMMON, env=env)
    assert r.returncode == 130, (r.returncode, r.stdout, r.stderr)  # stdout: which recipe was blocked, if one
    assert "put back" in r.stderr
    assert everything(site) == before and not (site / ".sm120patch").exists()
    if step == 25:  # bug 7: the plan after a Ctrl-C is the release's, not a half-written tree's
        said = {x["id"]: x["status"] for x in json.loads(sm("plan", site, *COMMON, "--json").stdout)["recipes"]}
        assert said[FIX] == "applicable" and said[AR] == "applicable", said


def test_preflight_plans_what_apply_installed_python_applies(venv: Path) -> None:
    """Bug 13 and item 6: preflight of the venv (`--python`) lists the FlashInfer backport and the
    gate standing on it, and `apply --installed --python` then applies exactly those, in that venv."""
    site, py = site_of(venv), venv / "bin" / "python"
    r = sm("preflight", "--python", py, *COMMON, "--no-torch", "--json")
    assert r.returncode in (0, 1), r.stderr
    said = {x["id"]: x for x in json.loads(r.stdout)["recipes"]}
    assert said[FIX]["status"] == "applicable" and FIX in said[AR]["advice"]
    r = sm("apply", "--installed", "--python", py, *COMMON, "--ok-blocked", "--json")
    assert r.returncode == 0, r.stderr
    done = {x["id"]: x["status"] for x in json.loads(r.stdout)["recipes"]}
    assert {i for i, x in said.items() if x["status"] == "applicable"} == {i for i, s in done.items() if s == "applied"}
    assert diff_from_release(site, "flashinfer", "0.6.3") and diff_from_release(site, "sglang", "0.5.9")
    gate_safe(site, "0.6.3")
    assert sm("rollback", "--installed", "--python", py).returncode == 0
    assert diff_from_release(site, "flashinfer", "0.6.3") == [] and diff_from_release(site, "sglang", "0.5.9") == []


def test_preflight_without_sglang_in_its_python_names_the_flag(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(empty)], check=True, timeout=120)
    # no SGLang is no mistake (issue 30): the machine report and the census answer, naming the flag
    r = sm("preflight", "--python", empty / "bin" / "python", *COMMON, "--no-torch")
    assert r.returncode == 0 and "sglang: not found" in r.stdout and "--python" in r.stdout, r.stdout + r.stderr
    r = sm("preflight", *COMMON, "--no-torch")  # the tool's own Python: sm120patch never depends on SGLang
    assert r.returncode == 0 and "pass --python EXE" in r.stdout, r.stdout + r.stderr


def test_a_hand_opened_gate_reading_an_unbound_name_is_not_satisfied(tmp_path: Path) -> None:
    """Bug 10: the allreduce gate opened by hand with `_is_sm120_supported`, which the module never
    binds, would raise NameError on SM12x: `failed`, naming the name. Bound, it is satisfied."""
    from tests.conftest import fetch_or_skip

    tree_ = fetch_or_skip("sglang", "0.5.9", tmp_path / "sg")
    comm = tree_ / "sglang/srt/layers/communicator.py"
    text = comm.read_text()
    gate = "(_is_sm90_supported or _is_sm100_supported)"
    assert text.count(gate) == 1
    replace(comm, text.replace(gate, "(_is_sm90_supported or _is_sm100_supported or _is_sm120_supported)"))
    edited = comm.read_bytes()

    def status() -> tuple[str, str]:
        r = sm("plan", tree_, "--arch", "sm_120", "--probe", "none", "--json", "--no-diff")
        x = next(x for x in json.loads(r.stdout)["recipes"] if x["id"] == AR)
        return x["status"], x["reason"]

    st, why = status()
    assert st == "failed" and "_is_sm120_supported" in why, (st, why)
    assert sm("apply", tree_, "--arch", "sm_120", "--probe", "none", "--recipe", AR).returncode == 1
    assert comm.read_bytes() == edited  # nothing written over the hand edit
    bound = "_is_sm100_supported = _is_cuda and is_sm100_supported()\n"
    replace(comm, comm.read_text().replace(bound, bound + "_is_sm120_supported = False\n"))
    edits = {
        e["name"]: e["outcome"]
        for e in next(
            x
            for x in json.loads(sm("plan", tree_, "--arch", "sm_120", "--probe", "none", "--json").stdout)["recipes"]
            if x["id"] == AR
        )["edits"]
    }
    assert "satisfied" in edits.values() and "error" not in edits.values(), edits


def test_a_killed_apply_is_named_by_plan_and_status_and_rollback_finishes_it(venv: Path) -> None:
    site = site_of(venv)
    before = everything(site)
    r = subprocess.run([*CLI, "apply", str(site), *COMMON], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "SM120PATCH_FAULT": "kill:30"})  # fmt: skip
    assert r.returncode == -9
    p = sm("plan", site, *COMMON, "--no-diff")
    assert p.returncode == 1 and f"sm120patch rollback {site}" in p.stderr and "killed" in p.stderr, p.stderr
    st = sm("status", site)
    assert st.returncode == 1 and f"sm120patch rollback {site}" in st.stdout
    assert sm("rollback", site).returncode == 0
    assert everything(site) == before


def test_journal_damage_advice_is_a_command_that_works(venv: Path) -> None:
    """Item 7: with its blobs deleted, status says so (exit 1) and gives a command; run as given
    (with this venv's pip, offline from the wheel cache), it brings back both releases' bytes, and
    `sm120patch rollback` then retires the journal after checking every file is at its original."""
    import re
    import shlex

    site = site_of(venv)
    assert sm("apply", site, *COMMON, "--ok-blocked").returncode == 0
    shutil.rmtree(site / ".sm120patch" / "blobs")
    st = sm("status", site)
    assert st.returncode == 1 and "DAMAGED JOURNAL" in st.stdout, st.stdout
    m = re.search(r"run `(pip install [^`]+)`", st.stdout)
    assert m, st.stdout
    pip_part, rm_part = m.group(1).split(" && ")
    assert pip_part == "pip install --force-reinstall --no-deps sglang==0.5.9 flashinfer-python==0.6.3"
    cmd = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *shlex.split(pip_part)[1:]]
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(releases.cache_dir() / "pypi")}
    assert subprocess.run([*cmd, "-q", "--no-compile"], env=env, capture_output=True, timeout=600).returncode == 0
    assert rm_part == f"sm120patch rollback {site}"  # retires the journal once the bytes are the releases'
    assert sm(*shlex.split(rm_part)[1:]).returncode == 0
    assert not (site / ".sm120patch").exists()
    assert diff_from_release(site, "sglang", "0.5.9") == [] and diff_from_release(site, "flashinfer", "0.6.3") == []
    assert sm("status", site).returncode == 0


def test_a_reader_who_may_not_write_can_plan_and_the_overlay_is_removable(venv: Path) -> None:
    """Item 4: `nobody` plans a root-owned site with read-only folders (an image): the FlashInfer
    backport is probed on an overlay it may patch and `rm -rf`; nothing in the site changes."""
    import tempfile

    from tests.reliability.conftest import as_user
    from tests.reliability.conftest import cli as run_as

    requires(os.geteuid() == 0, "needs root to run as another user (a root-owned site)")
    needs_tool("setpriv", "runs the planner as nobody")
    # not under pytest's tmp: each pytest session resets /tmp/pytest-of-root to 0700, so another
    # user's access there races with every other test run on the machine
    shared = Path(tempfile.mkdtemp(prefix="sm120patch-nobody-"))
    try:
        os.chmod(shared, 0o755)
        subprocess.run(["cp", "-a", str(venv), str(shared / "venv")], check=True)
        site = site_of(shared / "venv")
        for d in (site / "flashinfer", site / "sglang"):
            for dirpath, _, _ in os.walk(d):
                os.chmod(dirpath, 0o555)
        home = shared / "home"
        home.mkdir()
        os.chmod(home, 0o777)
        env = {"HOME": str(home), "XDG_CACHE_HOME": str(home / "cache"), "XDG_STATE_HOME": str(home / "state")}
        before = everything(site)
        r = run_as("plan", str(site), *COMMON, "--json", "--no-diff", user="nobody", env=env, timeout=600)
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
        said = {x["id"]: x["status"] for x in json.loads(r.stdout)["recipes"]}
        assert said[FIX] == "applicable" and said[AR] == "applicable", said
        assert everything(site) == before
        r = run_as("apply", str(site), *COMMON, user="nobody", env=env, timeout=600)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr  # may not write: refused, nothing written
        assert everything(site) == before
        overlays = home / "cache" / "sm120patch" / "overlays"
        assert any(overlays.iterdir())
        rm = subprocess.run([*as_user("nobody"), "rm", "-rf", str(overlays)], capture_output=True, text=True)
        assert rm.returncode == 0 and not overlays.exists(), rm.stderr
    finally:
        for dirpath, _, _ in os.walk(shared):
            os.chmod(dirpath, 0o755)
        shutil.rmtree(shared, ignore_errors=True)


def test_the_overlay_key_changes_when_pip_replaces_the_bytes(venv: Path) -> None:
    from sm120patch.probes.environment.overlay import overlay_root

    site = site_of(venv)
    change = {"jit/comm.py": b"# planned\n"}
    first = overlay_root(site / "flashinfer", change)
    assert overlay_root(site / "flashinfer", change) == first
    assert pip(venv, "--force-reinstall", str(wheel("flashinfer", "0.6.3"))).returncode == 0
    assert overlay_root(site / "flashinfer", change) != first


def test_commit_without_a_git_identity_writes_nothing_and_rollback_returns_to_the_branch(tmp_path: Path) -> None:
    """Item 5 on a real 0.5.9 clone: without user.name/email, `apply --commit` exits 2 before a
    byte is written (it was exit 3 with HEAD left on sm120patch/<arch>); with one, `rollback` of a
    --commit apply returns HEAD and the index to the branch it started from."""
    from tests.conftest import fetch_or_skip

    clone = fetch_or_skip("sglang", "0.5.9", tmp_path / "sg", layout="git")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(HOME=str(home), GIT_CONFIG_NOSYSTEM="1", XDG_CONFIG_HOME=str(home))

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=clone, capture_output=True, text=True, env=env).stdout.strip()

    start = git("rev-parse", "HEAD"), git("write-tree")
    r = sm("apply", clone, "--arch", "sm_120", "--probe", "none", "--commit", env=env)
    assert r.returncode == 2 and "config user.email" in r.stderr, (r.returncode, r.stderr)
    assert git("status", "--porcelain", "--ignored") == "" and git("symbolic-ref", "--short", "HEAD") == "main"
    git("config", "user.name", "T")
    git("config", "user.email", "t@example.com")
    r = sm("apply", clone, "--arch", "sm_120", "--probe", "none", "--commit", env=env)
    assert r.returncode == 0, r.stderr
    assert git("symbolic-ref", "--short", "HEAD") == "sm120patch/sm_120"
    assert sm("rollback", clone, env=env).returncode == 0
    assert git("symbolic-ref", "--short", "HEAD") == "main" and (git("rev-parse", "HEAD"), git("write-tree")) == start
    assert git("status", "--porcelain", "--ignored") == ""


def test_a_journal_an_older_version_kept_in_the_package_folder_still_rolls_back(venv: Path) -> None:
    """Backward compatible: the old code journaled `apply SITE/sglang` in SITE/sglang/.sm120patch with
    paths relative to that folder. status SITE names it (exit 1); rollback SITE/sglang restores."""
    import dataclasses

    from sm120patch.catalogue.recipes import load_recipes
    from sm120patch.engine import tree as engine
    from sm120patch.planning.targets import discover

    site = site_of(venv)
    (sg,) = discover(site, "sglang")
    old_layout = dataclasses.replace(sg, root=sg.package_dir)  # what the old code made of SITE/sglang
    from sm120patch.arch import parse_arch

    engine.apply(old_layout, load_recipes(), parse_arch("sm_120"))
    assert (site / "sglang" / ".sm120patch" / "journal.json").is_file()
    st = sm("status", site, "--package", "sglang")
    assert st.returncode == 1 and f"sm120patch rollback {site / 'sglang'}" in st.stdout, st.stdout
    assert sm("rollback", site / "sglang").returncode == 0
    assert diff_from_release(site, "sglang", "0.5.9") == [] and not (site / "sglang" / ".sm120patch").exists()


def test_the_cached_venv_was_never_written_in_place() -> None:
    """The copies are hard links: no test (nor sm120patch, nor pip) may have written through one."""
    site = site_of(pip_venv("0.5.9", "0.6.3"))
    assert diff_from_release(site, "sglang", "0.5.9") == [] and diff_from_release(site, "flashinfer", "0.6.3") == []
    assert not (site / ".sm120patch").exists()


def test_exclude_and_ok_blocked_give_an_image_build_an_exit_status_it_can_trust(venv: Path, tmp_path: Path) -> None:
    """Item 9: stock 0.5.9 + 0.6.3 `apply` exits 1 (b12x blocked by design); `--ok-blocked` makes that
    0 without hiding a failure; `--exclude` leaves a recipe out of plan, apply and export."""
    site = site_of(venv)
    before = tree(site, "flashinfer")
    r = sm("plan", site, *COMMON, "--no-diff", "--json")
    assert r.returncode == 1 and any(x["status"] == "blocked" for x in json.loads(r.stdout)["recipes"])
    r = sm("plan", site, *COMMON, "--no-diff", "--json", "--exclude", "sglang-fp4-gemm-b12x-sm120")
    said = {x["id"]: x["status"] for x in json.loads(r.stdout)["recipes"]}
    assert r.returncode == 0 and said["sglang-fp4-gemm-b12x-sm120"] == "excluded", said
    assert sm("apply", site, *COMMON, "--exclude", "no-such-recipe").returncode == 2
    out = tmp_path / "bundle"
    r = sm("export", site, *COMMON, "--exclude", FIX, "--ok-blocked", "-o", out)
    assert r.returncode == 0, r.stderr
    assert FIX not in (out / "series").read_text() and "sglang-moe-backend-sm120" in (out / "series").read_text()
    # without the backport the allreduce gate stays shut: blocked, which --ok-blocked accepts
    r = sm("apply", site, *COMMON, "--exclude", FIX, "--ok-blocked", "--json")
    said = {x["id"]: x["status"] for x in json.loads(r.stdout)["recipes"]}
    assert r.returncode == 0 and said[FIX] == "excluded" and said[AR] == "blocked", said
    assert tree(site, "flashinfer") == before and FIX not in applied(site)
    gate_safe(site, "0.6.3")


@pytest.mark.parametrize("step", [2, 20])
def test_ctrl_c_during_a_rollback_leaves_the_site_as_applied(venv: Path, step: int) -> None:
    """SIGINT inside rollback's writes (the dependents' and the backport's, one transaction): every
    file is put back as it was applied, exit 130; a plain rollback then restores both wheels."""
    site = site_of(venv)
    r = sm("apply", site, *COMMON, "--ok-blocked")
    assert r.returncode == 0 and {FIX, AR} <= set(applied(site)), (r.stdout, r.stderr)
    patched = tree(site, "sglang"), tree(site, "flashinfer")
    r = sm("rollback", site, "--recipe", FIX, env={**os.environ, "SM120PATCH_FAULT": f"int:{step}"})
    assert r.returncode == 130 and "put back" in r.stderr, (r.returncode, r.stdout, r.stderr)
    assert (tree(site, "sglang"), tree(site, "flashinfer")) == patched and {FIX, AR} <= set(applied(site))
    assert sm("rollback", site).returncode == 0
    assert diff_from_release(site, "sglang", "0.5.9") == [] and diff_from_release(site, "flashinfer", "0.6.3") == []
