"""The crash-signature catalogue loads, and its validation names the file and the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sm120patch.errors import RecipeError
from sm120patch.triage.signatures import arch_major, default_signatures_path, load_signatures

MATCHER = "regex = 'CUDA out of memory[.] Tried to allocate (?P<size>[0-9.]+ [KMG]iB)'"
GOOD = """
[[signature]]
id = "cuda-out-of-memory"
MATCHER
fatal = true
sm12x = "no"
class = "out-of-memory"
meaning = "Out of memory."
next_step = "Lower --mem-fraction-static."
sources = ["https://pytorch.org/docs/stable/notes/cuda.html"]
""".replace("MATCHER", MATCHER)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "signatures.toml"
    p.write_text(text, encoding="utf-8")
    return p


def test_catalogue_loads_with_unique_ids_and_sources() -> None:
    sigs = load_signatures()
    ids = [s.id for s in sigs]
    assert len(ids) == len(set(ids)) >= 10
    assert all(s.sources and s.meaning and s.next_step for s in sigs)
    assert default_signatures_path().name == "signatures.toml"


def test_catalogue_is_top_level_not_a_recipe_package() -> None:
    # load_recipes globs patches/*/*.toml: the catalogue must stay out of it.
    assert default_signatures_path().parent.name == "patches"


def test_good_file_compiles_regex(tmp_path: Path) -> None:
    (sig,) = load_signatures(write(tmp_path, GOOD))
    m = sig.search("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0")
    assert m and m.group("size") == "2.00 GiB"


def test_substring_is_literal(tmp_path: Path) -> None:
    text = GOOD.replace(MATCHER, 'substring = "a.b [x]"')
    (sig,) = load_signatures(write(tmp_path, text))
    assert sig.search("see a.b [x] here") and not sig.search("see axb x here")


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda t: t.replace("fatal = true", "fatal = true\nseverity = 1"), "severity: unknown key"),
        (lambda t: t.replace("fatal = true", 'fatal = "yes"'), ".fatal: is a str"),
        (lambda t: t.replace('meaning = "Out of memory."\n', ""), ".meaning: missing"),
        (lambda t: t.replace("(?P<size>", "(?P<size"), ".regex: bad regex"),
        (lambda t: t.replace('"Out of memory."', '"Out of {amount}."'), "uses {amount}"),
        (lambda t: t.replace('id = "cuda-out-of-memory"', 'id = "Bad Id"'), "lowercase-with-dashes"),
        (lambda t: t.replace("https://pytorch", "http://pytorch"), ".sources: must be"),
        (lambda t: t + t, "is used twice"),
        (lambda t: t.replace("[[signature]]", "[[signatures]]"), "signatures: unknown key"),
        (lambda t: t.replace("fatal = true", "fatal = true\nsubstring = 'x'"), "exactly one of"),
        (lambda t: t.replace('sm12x = "no"\n', ""), ".sm12x: missing"),
        (lambda t: t.replace('sm12x = "no"', 'sm12x = "likely"'), ".sm12x: is 'likely'"),
        (lambda t: t.replace('class = "out-of-memory"', 'class = "oom"'), ".class: is 'oom'"),
        (lambda t: t.replace('class = "out-of-memory"\n', ""), ".class: missing"),
        (lambda t: t.replace('sm12x = "no"', 'sm12x = "maybe"'), ".check: missing"),
        (lambda t: t.replace('sm12x = "no"', 'sm12x = "no"\narch_group = "arch"'), "which no regex captures"),
        (lambda t: t + '[signature.advice]\nollama = "x"\n', "advice.ollama: is not a known framework"),
        (lambda t: t + '[signature.advice]\nvllm = "--gpu-memory-utilization {fraction}"\n', "uses {fraction}"),
        (lambda t: t + '[signature.by_value.limit."1"]\nmeans = "x"\n', "by_value.limit: is not a named group"),
        (lambda t: t + '[signature.by_value.size."1"]\nsm12x = "no"\n', "by_value.size.1.means: missing"),
        (lambda t: t + '[signature.by_value.size."1"]\nmeans = "x"\nwho = 1\n', "who: unknown key"),
    ],
)
def test_validation_errors_are_one_line_with_file_and_key(tmp_path: Path, edit, needle: str) -> None:
    path = write(tmp_path, edit(GOOD))
    with pytest.raises(RecipeError) as e:
        load_signatures(path)
    msg = str(e.value)
    assert needle in msg and str(path) in msg and "\n" not in msg


def test_verdict_by_arch_group_and_value(tmp_path: Path) -> None:
    text = GOOD.replace(MATCHER, "regex = 'limit (?P<limit>\\d+) on (?P<arch>sm_\\w+)'").replace(
        'sm12x = "no"', 'sm12x = "maybe"\ncheck = "nvidia-smi"\narch_group = "arch"'
    )
    text += '[signature.by_value.limit."101376"]\nsm12x = "maybe"\nmeans = "99 KB: SM86, SM89, SM12x"\n'
    text = text.replace('meaning = "Out of memory."', 'meaning = "{limit_means}"')
    (sig,) = load_signatures(write(tmp_path, text))
    details = {"limit": "101376", "arch": "sm_120"}
    assert sig.judge(details) == "yes" and details["limit_means"] == "99 KB: SM86, SM89, SM12x"
    assert sig.judge({"limit": "101376", "arch": "sm_86"}) == "no"
    assert sig.judge({"limit": "101376"}) == "maybe"


def test_advice_is_per_framework(tmp_path: Path) -> None:
    text = GOOD + '[signature.advice]\nvllm = "Lower --gpu-memory-utilization."\n'
    (sig,) = load_signatures(write(tmp_path, text))
    assert sig.next_step_for("vllm") == "Lower --gpu-memory-utilization."
    assert sig.next_step_for("sglang") == sig.next_step_for(None) == "Lower --mem-fraction-static."


@pytest.mark.parametrize(
    ("text", "major"),
    [("sm_120a", 12), ("compute_121", 12), ("12.0", 12), ("120", 12), ("compute_86", 8), ("90", 9), ("sm_1", None)],
)
def test_arch_major(text: str, major: int | None) -> None:
    assert arch_major(text) == major


def test_catalogue_verdicts_are_honest() -> None:
    """'yes' only where the text itself names SM12x; every 'maybe' says how to tell."""
    for sig in load_signatures():
        assert sig.sm12x in ("yes", "maybe", "no")
        if sig.sm12x == "maybe":
            assert sig.check, sig.id
        if sig.sm12x == "yes" and not sig.arch_group:  # an arch_group is judged per match
            unmarked = [a for a in _alternatives(sig.pattern.pattern) if not SM12X_MARK.search(a)]
            assert unmarked == [], (sig.id, unmarked)


# What a pattern must spell to name SM12x itself: sm_120/sm_121 (sm_?12[01], sm120, SM12x), compute_12x,
# compute capability 12.x, a bare 120/121, never just any "12" (a 128-thread limit, CUDA 12.4)
SM12X_MARK = re.compile(
    r"sm_\?12|sm_12|sm12[01x]|SM12|compute_\(\?P<\w+>12|compute_12|capability 12|12\[01\]|\b12[01]\b", re.I
)


def _alternatives(pattern: str) -> list[str]:
    """The top-level `|` alternatives of a regex source (each must name SM12x on its own)."""
    out, cur, depth, esc, in_class = [], "", 0, False, False
    for ch in pattern:
        if esc:
            cur, esc = cur + ch, False
            continue
        if ch == "\\":
            cur, esc = cur + ch, True
            continue
        if in_class:
            cur, in_class = cur + ch, ch != "]"
            continue
        in_class = ch == "["
        depth += (ch == "(") - (ch == ")")
        if ch == "|" and depth == 0:
            out, cur = [*out, cur], ""
            continue
        cur += ch
    return [*out, cur]


@pytest.mark.parametrize(
    ("pattern", "names_sm12x"),
    [
        (r"expects arch to be one of \[[^\]]*\], but got sm_12[01]", True),
        (r"with capability 12[01]\b|\bSM12[01]\b has no kernel", True),
        (r"max 128 threads per block", False),  # the old check took any "12"
        (r"CUDA 12\.4 required|sm_120 unsupported", False),  # one alternative names no SM12x
        (r"Unsupported gpu architecture 'compute_(?P<arch>12[01][af]?)'", True),
    ],
)
def test_the_honesty_rule_tells_a_pattern_that_names_sm12x(pattern: str, names_sm12x: bool) -> None:
    assert all(SM12X_MARK.search(a) for a in _alternatives(pattern)) is names_sm12x


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="cannot read"):
        load_signatures(tmp_path / "nope.toml")
    with pytest.raises(RecipeError, match="invalid TOML"):
        load_signatures(write(tmp_path, "[[signature]\n"))


def test_every_signature_has_a_row_in_the_crash_doc() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "crashed.md").read_text(encoding="utf-8")
    rows = {line.split("|")[2].strip().strip("`") for line in doc.splitlines() if line.startswith("| `")}
    assert rows == {s.id for s in load_signatures()}


def test_fixed_by_names_real_recipes() -> None:
    from sm120patch.catalogue.recipes import load_recipes

    ids = {r.id for r in load_recipes()}
    named = {r for s in load_signatures() for r in s.fixed_by}
    assert named and named <= ids, named - ids
