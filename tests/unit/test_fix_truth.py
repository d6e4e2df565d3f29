"""The fix truth of the triage corpus (tests/corpus/triage/fix/, issue 32 item 2) and the fix-useful score.

The truth is keywords written from each thread; diagnose's advice is scored against it by
tools/fix_score.py. The floors are what diagnose scored when the truth was written: a change
that makes the advice worse fails here; the issue's targets, where not met yet, are strict xfails,
so meeting one shows up as an XPASS failure to be turned into a plain assertion.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools import fix_score  # noqa: E402
from tools.triage_score import ONE_SHOT_FILES, CorpusError, load_corpus, tomllib  # noqa: E402

CASES = {c.id: c for c in load_corpus()}
RAW = {p.stem: tomllib.loads(p.read_text(encoding="utf-8"))["case"] for p in sorted(fix_score.FIX_DIR.glob("*.toml"))}
# measured (in-sample: every part is open for development since it was scored once) with the advice
# diagnose gives (triage/advice.py's add_advice, the path the CLI and guard call):
# (SM12x cases, unknown, class right of all of them, fix useful of those whose thread settled a fix)
# held-out 1 and 2 got their truth on 2026-12-03, written blind to diagnose's output and to the advice
# code, and were scored once with it: their fix useful figures are the first ones measured on truth
# the advice was never developed against (one shot: 15/32 and 10/16; the class figures are in-sample).
# Then opened: four sourced workarounds rows (patches/workarounds.toml) made them 16/32 and 12/16, in-sample;
# advice that reads the lines below a fault (the library, flag and op there; graphs, math wheels, app
# environments) made them 19/32 and 14/16, in-sample; the first releases with SM12x code per library
# (patches/fixed_versions.toml, each row held to the real wheels) made held-out 1 21/32 (PaddlePaddle's cu129 build)
# and held-out 11 3/9 (ONNX Runtime's versions)
FLOOR = {
    "held-out": (48, 16, 43, 21),
    "held-out-2": (48, 32, 47, 14),
    "held-out-3": (50, 27, 45, 17),
    "held-out-4": (48, 26, 46, 18),
    "held-out-5": (37, 20, 34, 13),
    "held-out-6": (38, 20, 35, 15),
    "held-out-7": (31, 14, 29, 14),
    "held-out-8": (20, 9, 19, 11),
    "held-out-9": (9, 3, 7, 4),
    # collected blind 2026-12-04 with its truth (written by the collectors from the pages, blind to the advice),
    # scored once on 1806073: class right 17/21 (6/8 of the known), fix useful 3/8 (37.5%), short of the 70 % target.
    # Then opened (advice for the compilers that are not the toolkit on PATH): 19/21, 5/8, in-sample
    "held-out-10": (21, 13, 19, 5),
    # collected blind 2026-12-04 (six GitHub partitions) with its truth, scored once on 582135a: class right 4/15
    # (2/9 of the known), fix useful 0/9. Then opened (NCCL's shared-memory line, NCCL INFO as chatter, ...):
    # 7/15 and 2/9, in-sample
    "held-out-11": (15, 6, 7, 3),
    # collected blind 2026-12-06 (seven partitions, the error line required) with its truth, scored once on 718bfd6:
    # class right 9/12 (3/4 of the known), fix useful 3/4; 8 of its 12 SM12x threads never settled a fix.
    # Then opened (a 12.1 GPU past a 12.0 PyTorch build is a warning, a build naming the CUDA a capability needs):
    # 11/12, 4/4, in-sample
    "held-out-12": (12, 8, 11, 4),
}
CLASS_TARGET, FIX_TARGET = 0.90, 0.70


def test_every_held_out_part_with_sm12x_cases_has_a_truth_file() -> None:
    assert set(RAW) == set(FLOOR) == {"held-out", "held-out-2", *ONE_SHOT_FILES}, sorted(RAW)


@pytest.mark.parametrize("part", sorted(RAW))
def test_every_entry_names_a_case_of_its_part_with_keywords_or_unknown_and_a_source(part: str) -> None:
    bad = []
    for entry in RAW[part]:
        case = CASES.get(entry.get("id", ""))
        if case is None or case.part != part or not case.sm12x:
            bad.append(f"{entry.get('id')!r}: no SM12x case of {part}")
            continue
        alts = entry.get("fix", [])
        if entry.get("fix_unknown") is not True and not (alts and all(a and all(w.strip() for w in a) for a in alts)):
            bad.append(f"{case.id}: no keywords and not fix_unknown")
        if entry.get("fix_unknown") is True and alts:
            bad.append(f"{case.id}: both keywords and fix_unknown")
        if not entry.get("fix_source", "").strip():
            bad.append(f"{case.id}: no fix_source")
    assert not bad, f"tests/corpus/triage/fix/{part}.toml: " + "; ".join(bad)


@pytest.mark.parametrize("part", sorted(RAW))
def test_every_sm12x_case_of_the_part_has_exactly_one_truth(part: str) -> None:
    ids = [e["id"] for e in RAW[part]]
    want = sorted(c.id for c in CASES.values() if c.part == part and c.sm12x)
    assert sorted(ids) == want, set(want) ^ set(ids)


def test_the_loader_rejects_a_bad_entry(tmp_path: Path) -> None:
    """The validation can fail: a missing source, an empty alternative, an unknown key, neither fix nor unknown."""
    for body, says in (
        ('id = "x"\nfix = [["a"]]\n', "fix_source"),
        ('id = "x"\nfix = [[]]\nfix_source = "s"\n', "non-empty list"),
        ('id = "x"\nfix = [["a"]]\nfix_source = "s"\nfixes = 1\n', "unknown key"),
        ('id = "x"\nfix_source = "s"\n', "either"),
        ('id = "x"\nfix = [["a"]]\nfix_unknown = true\nfix_source = "s"\n', "either"),
    ):
        (tmp_path / "p.toml").write_text("[[case]]\n" + body)
        with pytest.raises(CorpusError, match=says):
            fix_score.load_truth(tmp_path)


def test_a_truth_for_no_case_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text('[[case]]\nid = "no-such-case"\nfix = [["a"]]\nfix_source = "s"\n')
    with pytest.raises(CorpusError, match="no-such-case"):
        fix_score.score(list(CASES.values()), fix_score.load_truth(tmp_path))


def test_useful_needs_every_word_of_one_alternative() -> None:
    alts = (("--attention-backend", "triton"), ("sglang>=0.5.10",))
    assert fix_score.useful(alts, "pass --attention-backend triton")
    assert fix_score.useful(alts, "upgrade: pip install 'sglang>=0.5.10'")
    assert not fix_score.useful(alts, "pass --attention-backend flashinfer")
    assert not fix_score.useful(alts, "")


def test_advice_text_reads_what_to_do_not_the_log_line_or_meaning() -> None:
    """A keyword that only the quoted log line or the meaning holds does not make the advice useful."""
    findings = [
        {"fatal": True, "line": "torch 2.6.0+cu124", "meaning": "needs cu128", "next_step": "Run X.", "notes": ["n1"]},
        {"fatal": False, "next_step": "TRITON_PTXAS_PATH"},
        {"fatal": True, "advice": {"flag": "--moe-runner-backend", "values": ["triton"]}},
    ]
    text = fix_score.advice_text(findings)
    assert "run x." in text and "n1" in text and "--moe-runner-backend" in text and "triton" in text
    assert "cu124" not in text and "cu128" not in text and "triton_ptxas_path" not in text


@pytest.fixture(scope="module")
def figures() -> dict[str, dict[str, object]]:
    return fix_score.figures(fix_score.score(list(CASES.values()), fix_score.load_truth()))


@pytest.mark.parametrize("part", sorted(FLOOR))
def test_fix_useful_and_class_right_do_not_sink_below_what_was_measured(part: str, figures: dict) -> None:
    f = figures[part]
    cases, unknown, class_right, useful = FLOOR[part]
    assert (f["cases"], f["unknown"]) == (cases, unknown), f"{part}: the truth changed; measure the floors again"
    assert f["class_right_all"] >= class_right, f"{part}: class right {f['class_right_all']}/{cases} < {class_right}"
    assert f["fix_useful"] >= useful, (
        f"{part}: fix useful {f['fix_useful']}/{f['known']} < {useful}; class right, advice misses: "
        + ", ".join(f["class_right_not_useful"])
    )


def _target_marks(kind: str) -> list:
    """One param per one-shot part; a strict xfail where the figure measured now is below the target."""
    out = []
    for part, (cases, unknown, class_right, useful) in sorted(FLOOR.items()):
        met = class_right / cases >= CLASS_TARGET if kind == "class" else useful / (cases - unknown) >= FIX_TARGET
        marks = [] if met else [pytest.mark.xfail(strict=True, reason=f"issue 32: {kind} target not met on {part}")]
        out.append(pytest.param(part, marks=marks, id=part))
    return out


@pytest.mark.parametrize("part", _target_marks("class"))
def test_class_right_target(part: str, figures: dict) -> None:
    f = figures[part]
    assert f["class_right_all"] / f["cases"] >= CLASS_TARGET, f"{part}: {f['class_right_all']}/{f['cases']}"


@pytest.mark.parametrize("part", _target_marks("fix"))
def test_fix_useful_target(part: str, figures: dict) -> None:
    f = figures[part]
    assert f["fix_useful"] / f["known"] >= FIX_TARGET, f"{part}: {f['fix_useful']}/{f['known']}"
