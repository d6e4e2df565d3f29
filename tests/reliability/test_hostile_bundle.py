"""Hostile bundles and output folders, as a tool that runs as root in image builds meets them.

`export --force` replaces only a bundle export wrote and that holds nothing else; `-o` may not be
a symlink, a file or a folder inside the tree. `apply --bundle` and `preflight --bundle` refuse a
bundle whose patches touch anything but the files its manifest lists, inside the folder holding
the package, or whose files are not plain files of a sane size. Every case: one
`sm120patch: error:` line naming the file and the fix, exit 2, no traceback, and every byte of the
tree, the bundle and the files beside them as it was (compared byte for byte).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.conftest import (
    COMMUNICATOR_REL,
    MODEL_RUNNER_REL,
    SERVER_ARGS_REL,
    assert_clean_failure,
    cli,
    count,
    make_fake,
)

ARCH = ("--arch", "sm_120", "--probe", "none")
ALLREDUCE = "sglang-allreduce-fusion-sm120"
FIRST = f"0001-{ALLREDUCE}.patch"  # patches communicator.py and server_args.py


def contents(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file and link under `root`: bytes (links by their target, folders by a marker) and
    mtime, so a file written back with its own bytes counts too. The oracle of every case."""
    out: dict[str, tuple[bytes, int]] = {}
    paths = [root] if root.is_symlink() or not root.is_dir() else sorted(root.rglob("*"))
    for p in paths:
        rel = p.relative_to(root).as_posix()
        st = p.lstat()
        if p.is_symlink():
            out[rel] = (b"link:" + os.readlink(p).encode(), 0)
        elif p.is_dir():
            out[rel + "/"] = (b"", 0)
        elif p.is_file():
            out[rel] = (p.read_bytes() if st.st_size < 1 << 20 else b"sparse:%d" % st.st_size, st.st_mtime_ns)
        else:
            out[rel] = (b"special", st.st_mtime_ns)
    return out


def bytes_lost(before: dict[str, tuple[bytes, int]], after: dict[str, tuple[bytes, int]]) -> int:
    """Bytes of files that are gone or hold other bytes now."""
    return sum(len(v[0]) for k, v in before.items() if k not in after or after[k][0] != v[0])


def refused(args: list[str], names: tuple[str, ...], watched: list[Path], timeout: float = 120) -> str:
    """Run the CLI: it must refuse cleanly and leave every watched folder exactly as it was."""
    before = {p: contents(p) for p in watched if p.exists() or p.is_symlink()}
    r = cli(*args, timeout=timeout)
    assert_clean_failure(r, *names)
    after = {p: contents(p) for p in before}
    lost = sum(bytes_lost(before[p], after[p]) for p in before)
    count("bytes_lost", lost)
    count("hostile_cases")
    count("hostile_bundle_cases")
    assert after == before, [p for p in before if after[p] != before[p]]
    assert lost == 0
    return r.stderr


# --- export -o and --force ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real export of the fake tree; each case works on a copy."""
    root = tmp_path_factory.mktemp("made")
    tree = make_fake(root / "tree")
    r = cli("export", str(tree), *ARCH, "-o", str(root / "bundle"))
    assert r.returncode == 0, r.stderr
    assert (root / "bundle" / FIRST).is_file()
    return root / "bundle"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_fake(tmp_path / "tree")


def export_args(tree: Path, out: Path, *extra: str) -> list[str]:
    return ["export", str(tree), *ARCH, "--ok-blocked", "-o", str(out), *extra]


def test_force_keeps_a_project_that_has_a_manifest_json(tree: Path, tmp_path: Path) -> None:
    """The case of issue 35: `--force` deleted src/app.js of any folder with a manifest.json."""
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "manifest.json").write_text('{"name":"app"}\n')
    (proj / "src" / "app.js").write_text("x\n")
    err = refused(export_args(tree, proj, "--force"), (str(proj), "remove it yourself"), [proj, tree])
    assert "--force replaces only a bundle sm120patch wrote" in err
    assert (proj / "src" / "app.js").read_text() == "x\n"
    # without --force the hint is not --force: this folder is not ours to replace
    assert "--force" not in refused(export_args(tree, proj), (str(proj),), [proj, tree])


def _bundle_with(made: Path, dest: Path, change: Callable[[Path], None]) -> Path:
    shutil.copytree(made, dest, symlinks=True)
    change(dest)
    return dest


def _extra_file(b: Path) -> None:
    (b / "notes.txt").write_text("mine\n")


def _extra_folder(b: Path) -> None:
    (b / "src").mkdir()
    (b / "src" / "app.js").write_text("x\n")


def _patch_is_a_link(b: Path) -> None:
    victim = b.parent / "passwd"
    victim.write_text("root:x:0:0::/root:/bin/sh\n")
    (b / FIRST).unlink()
    (b / FIRST).symlink_to(victim)


def _manifest_is_a_link(b: Path) -> None:
    real = b.parent / "elsewhere.json"
    shutil.move(b / "manifest.json", real)
    (b / "manifest.json").symlink_to(real)


def _other_schema(b: Path) -> None:
    data = json.loads((b / "manifest.json").read_text())
    data["schema"] = 99
    (b / "manifest.json").write_text(json.dumps(data))


def _series_names_a_path(b: Path) -> None:
    data = json.loads((b / "manifest.json").read_text())
    data["series"].append("../../victim")
    (b / "manifest.json").write_text(json.dumps(data))


def _unlisted_patch(b: Path) -> None:
    (b / "0009-mine.patch").write_text("my own work\n")


def _patch_is_a_folder(b: Path) -> None:
    (b / FIRST).unlink()
    (b / FIRST).mkdir()
    (b / FIRST / "keep.txt").write_text("mine\n")


NOT_OURS = {
    "an extra file": _extra_file,
    "an extra folder": _extra_folder,
    "a patch that is a symlink to /etc/passwd": _patch_is_a_link,
    "a manifest.json that is a symlink": _manifest_is_a_link,
    "another schema": _other_schema,
    "a series entry that is a path": _series_names_a_path,
    "a patch the manifest does not list": _unlisted_patch,
    "a patch name that is a folder": _patch_is_a_folder,
}


@pytest.mark.parametrize("case", sorted(NOT_OURS))
def test_force_refuses_a_bundle_folder_holding_anything_else(case: str, made: Path, tree: Path, tmp_path: Path) -> None:
    out = _bundle_with(made, tmp_path / "out", NOT_OURS[case])
    refused(export_args(tree, out, "--force"), (str(out), "remove it yourself"), [tmp_path])


def test_force_replaces_our_own_bundle_and_leaves_nothing_beside_it(made: Path, tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(made, out)
    (out / FIRST).write_text("an older export\n")  # a damaged or older bundle of ours may be replaced
    r = cli(*export_args(tree, out, "--force"))
    assert r.returncode == 0, r.stderr
    assert {k: v[0] for k, v in contents(out).items()} == {k: v[0] for k, v in contents(made).items()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tree"]  # no temp or old folder left
    count("hostile_bundle_cases")


def test_output_that_is_a_symlink_is_refused(made: Path, tree: Path, tmp_path: Path) -> None:
    """`-o` a link: to an empty folder, and to a bundle (the replace would act on the link's target)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    theirs = tmp_path / "theirs"
    shutil.copytree(made, theirs)
    for target in (empty, theirs):
        link = tmp_path / f"link-to-{target.name}"
        link.symlink_to(target, target_is_directory=True)
        refused(export_args(tree, link, "--force"), (str(link), "symlink"), [tmp_path])


def test_output_inside_the_tree_is_refused(tree: Path, tmp_path: Path) -> None:
    for out in (tree / "bundle", tree / "sglang" / "bundle", tree):
        refused(export_args(tree, out, "--force"), (str(out), "inside"), [tmp_path])
    assert not (tree / "bundle").exists()


def test_output_that_is_a_file_is_refused(tree: Path, tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("mine\n")
    refused(export_args(tree, f, "--force"), (str(f), "is a file"), [tmp_path])


# --- apply --bundle / preflight --bundle on hostile bundles ---------------------------------------


def rehash(b: Path) -> None:
    """What an attacker does after editing a patch: record its new sha256 in the manifest."""
    data = json.loads((b / "manifest.json").read_text())
    for r in data["recipes"]:
        if r["patch"]:
            r["patch_sha256"] = hashlib.sha256((b / r["patch"]).read_bytes()).hexdigest()
    (b / "manifest.json").write_text(json.dumps(data, indent=2))


def retarget(new: str) -> Callable[[str], str]:
    """The first patch's communicator.py diff made to patch `new` instead (every header);
    `VICTIM` in `new` stands for the victim file's absolute path, filled in by hostile_bundle."""
    return lambda text: text.replace(f"a/{COMMUNICATOR_REL}", f"a/{new}").replace(f"b/{COMMUNICATOR_REL}", f"b/{new}")


def _section(text: str, rel: str) -> str:
    """The diff of `rel` in a patch text, from `diff --git` to the next one."""
    start = text.index(f"diff --git a/{rel} b/{rel}\n")
    nxt = text.find("\ndiff --git ", start + 1)
    end = text.rfind("\n-- \n") if nxt < 0 else nxt
    return text[start : end + 1]


def add_unlisted(where: str) -> Callable[[str], str]:
    """A second copy of the communicator.py diff aimed at utils.py (in the tree, not in the
    manifest), put into the diff section, the message, or after the signature."""

    def edit(text: str) -> str:
        extra = _section(text, COMMUNICATOR_REL).replace(COMMUNICATOR_REL, "sglang/srt/utils.py")
        if where == "diff":
            at = text.index("diff --git ")
            return text[:at] + extra + text[at:]
        if where == "message":  # traditional ---/+++ headers, unindented: git apply and patch take them
            at = text.index("\n---\n")
            return text[:at] + "\n" + extra.split("\n", 2)[2] + text[at:]
        return text + extra  # after the signature

    return edit


def header(old: str, new: str) -> Callable[[str], str]:
    """Replace one header line of the communicator.py diff (rename, /dev/null, modes, binary)."""
    return lambda text: text.replace(old, new, 1)


INDEX_LINE = "index "
HOSTILE_PATCHES: dict[str, Callable[[str], str]] = {
    "re-targeted to ../../victim.py": retarget("../../victim.py"),
    "re-targeted to sglang/../../victim.py": retarget("sglang/../../victim.py"),
    "re-targeted to an absolute path": retarget("VICTIM"),
    "re-targeted to a file the manifest does not list": retarget("sglang/srt/utils.py"),
    "an extra diff of an unlisted file": add_unlisted("diff"),
    "an unlisted diff hidden in the message": add_unlisted("message"),
    "an unlisted diff after the signature": add_unlisted("signature"),
    "a rename": header(f"--- a/{COMMUNICATOR_REL}", f"rename from {COMMUNICATOR_REL}\n--- a/{COMMUNICATOR_REL}"),
    "a new file from /dev/null": header(f"--- a/{COMMUNICATOR_REL}", "--- /dev/null"),
    "a deletion to /dev/null": header(f"+++ b/{COMMUNICATOR_REL}", "+++ /dev/null"),
    "a mode change": header(f"--- a/{COMMUNICATOR_REL}", f"new mode 100755\n--- a/{COMMUNICATOR_REL}"),
    "traditional headers without a/ b/": header(
        f"--- a/{COMMUNICATOR_REL}\n+++ b/{COMMUNICATOR_REL}", f"--- {COMMUNICATOR_REL}\n+++ {COMMUNICATOR_REL}"
    ),
    "a binary patch": header(f"--- a/{COMMUNICATOR_REL}", "GIT binary patch\nliteral 0"),
}


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A node tree of the release, and beside it the victims a re-targeted patch would reach:
    files with communicator.py's own bytes, so its hunks would apply there."""
    n = make_fake(tmp_path / "node")
    communicator = (n / COMMUNICATOR_REL).read_bytes()
    (tmp_path / "victim.py").write_bytes(communicator)  # node/sglang/../../victim.py
    return n


def hostile_bundle(made: Path, dest: Path, edit: Callable[[str], str]) -> Path:
    b = _bundle_with(made, dest, lambda b: None)
    p = b / FIRST
    text = p.read_text()
    p.write_text(
        edit(text)
        .replace("a/VICTIM", f"a/{dest.parent / 'victim.py'}")  # a//tmp/...: an absolute path
        .replace("b/VICTIM", f"b/{dest.parent / 'victim.py'}")
    )
    assert p.read_text() != text
    rehash(b)
    return b


@pytest.mark.parametrize("case", sorted(HOSTILE_PATCHES))
def test_apply_bundle_refuses_a_patch_that_touches_other_files(
    case: str, made: Path, node: Path, tmp_path: Path
) -> None:
    b = hostile_bundle(made, tmp_path / "hostile", HOSTILE_PATCHES[case])
    watched = [tmp_path]
    refused(["apply", "--bundle", str(b), str(node), *ARCH, "--no-diff"], (FIRST, "export the bundle again"), watched)
    assert not (node / ".sm120patch").exists()
    # the node check reads the same bundle: refused too, never advising `git apply -R` of it
    refused(["preflight", "--bundle", str(b), str(node), *ARCH], (FIRST,), watched)


def _manifest_path(new: str) -> Callable[[Path], None]:
    """Manifest and patch agree on a path outside the package (both edited, rehashed)."""

    def change(b: Path) -> None:
        (b / FIRST).write_text(retarget(new)((b / FIRST).read_text()))
        data = json.loads((b / "manifest.json").read_text())
        for f in data["recipes"][0]["files"]:
            if f["path"] == COMMUNICATOR_REL:
                f["path"] = new
        (b / "manifest.json").write_text(json.dumps(data))
        rehash(b)

    return change


def _series_extra(b: Path) -> None:
    with (b / "series").open("a") as f:
        f.write("../../etc/passwd\n")


def _series_missing_file(b: Path) -> None:
    with (b / "series").open("a") as f:
        f.write("0004-not-in-the-bundle.patch\n")


def _patch_link_same_bytes(b: Path) -> None:
    """A symlink whose target holds the very bytes the manifest hashes: only the link is wrong."""
    real = b.parent / "elsewhere.patch"
    shutil.move(b / FIRST, real)
    (b / FIRST).symlink_to(real)


def _patch_fifo(b: Path) -> None:
    (b / FIRST).unlink()
    os.mkfifo(b / FIRST)


def _huge_patch(b: Path) -> None:
    with (b / FIRST).open("r+b") as f:
        f.truncate(8 << 30)  # sparse: 8 GiB that read_bytes() would have read whole


def _huge_manifest(b: Path) -> None:
    with (b / "manifest.json").open("ab") as f:
        f.truncate(8 << 30)


def _deep_path(b: Path) -> None:
    _manifest_path("sglang/" + "d/" * 3000 + "x.py")(b)


def _edit(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(b: Path) -> None:
        data = json.loads((b / "manifest.json").read_text())
        change(data)
        (b / "manifest.json").write_text(json.dumps(data))

    return edit


def _id_is_a_path(b: Path) -> None:
    """apply --bundle named a scratch file after the id: `../../x` wrote x.diff (the patch) anywhere."""
    _edit(lambda d: d["recipes"][0].update(id="../" * 12 + str(b.parent)[1:] + "/PWNED"))(b)


OSC52 = "\x1b]52;c;aGVsbG8=\x07"  # a terminal clipboard write, as a not-exported recipe's reason

HOSTILE_FOLDERS: dict[str, tuple[Callable[[Path], None], str]] = {
    "a recipe id that is a path": (_id_is_a_path, "is not a recipe id"),
    "a reason holding an OSC 52 clipboard write": (
        _edit(lambda d: d["recipes"][-1].update(reason=OSC52)),
        "control character",
    ),
    "a proof holding a carriage return": (_edit(lambda d: d["recipes"][0].update(proof="ok\rFAKE")), "control"),
    "a title holding a lone surrogate": (_edit(lambda d: d["recipes"][0].update(title="\ud800")), "surrogate"),
    "manifest and patch name sglang/../../victim.py": (_manifest_path("sglang/../../victim.py"), "manifest.json"),
    "manifest and patch name an absolute path": (_manifest_path("/etc/passwd"), "manifest.json"),
    "manifest and patch name sglang/./srt/x.py": (_manifest_path("sglang/./srt/layers/communicator.py"), "manifest"),
    "manifest and patch name a 6000-character path": (_deep_path, "manifest.json"),
    "series names a path out of the bundle": (_series_extra, "series"),
    "series names a patch not in the bundle": (_series_missing_file, "series"),
    "a patch that is a symlink": (_patch_link_same_bytes, "symlink"),
    "a manifest.json that is a symlink": (_manifest_is_a_link, "symlink"),
    "a patch that is a FIFO": (_patch_fifo, "not a plain file"),
    "an 8 GiB patch": (_huge_patch, "MiB"),
    "an 8 GiB manifest.json": (_huge_manifest, "MiB"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_FOLDERS))
def test_bundle_folder_that_is_not_what_export_wrote(case: str, made: Path, node: Path, tmp_path: Path) -> None:
    change, word = HOSTILE_FOLDERS[case]
    b = _bundle_with(made, tmp_path / "hostile", change)
    watched = [node, tmp_path / "victim.py"]
    refused(["apply", "--bundle", str(b), str(node), *ARCH, "--no-diff"], (word,), watched, timeout=60)
    refused(["preflight", "--bundle", str(b), str(node), *ARCH], (word,), watched, timeout=60)
    assert not (node / ".sm120patch").exists() and not list(tmp_path.glob("PWNED*"))


# --- the tree side: a patched file reached through a symlink ---------------------------------------


@pytest.mark.parametrize("linked", ["sglang/srt/layers", COMMUNICATOR_REL, "sglang"])
def test_apply_bundle_never_writes_through_a_symlink_in_the_tree(
    linked: str, made: Path, node: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(node / linked, outside / "moved")
    (node / linked).symlink_to(outside / "moved", target_is_directory=(outside / "moved").is_dir())
    err = refused(
        ["apply", "--bundle", str(made), str(node), *ARCH, "--no-diff"], ("symlink", str(node / linked)), [tmp_path]
    )
    assert "export the bundle again" not in err  # the tree is the problem here, not the bundle


def test_a_good_bundle_still_applies_and_rolls_back(made: Path, node: Path) -> None:
    """The counter-test: the checks refuse hostile bundles, not ours."""
    before = contents(node)
    r = cli("apply", "--bundle", str(made), str(node), *ARCH, "--no-diff")
    assert r.returncode == 0, r.stderr
    for rel in (COMMUNICATOR_REL, SERVER_ARGS_REL, MODEL_RUNNER_REL):
        assert (node / rel).read_bytes() != before[rel][0]
    assert cli("preflight", "--bundle", str(made), str(node), *ARCH).returncode == 0
    assert cli("rollback", str(node)).returncode == 0
    assert {k: v[0] for k, v in contents(node).items()} == {k: v[0] for k, v in before.items()}
