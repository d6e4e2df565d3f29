"""diagnose on real crash excerpts (tests/corpus/triage/): the targets of issues 13 and 23.

The oracle is the corpus: each case's cause, class, fix and expected id were written by hand
from the public thread it comes from. These tests only compare diagnose's answer with them.
Issue 13's targets hold on the seed corpus (sm12x.toml, other.toml, heldout.toml); issue 23's
on the development part (dev-*.toml), on held-out 1, 2 and 3 (heldout-a/-b.toml, heldout-c.toml,
heldout-d*/-e*.toml, heldout-f*/-g*.toml, heldout-h*/-i*.toml, heldout-j*/-k*.toml, heldout-l*/-m*.toml,
heldout-n*/-o*.toml: each scored once, then opened for development) and on held-out 9 (heldout-p*/-q*.toml:
collected blind, scored once by the integrator after the classifier was merged).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.triage_score import (
    ONE_SHOT_FILES,
    Case,
    CorpusError,
    Outcome,
    load_corpus,
    run_case,
    score,
)

CASES = load_corpus()
RECALL_TARGET = 0.90
# issue 23: SM12x right (class or id, SM12x not denied) on each part, 0 false alarms, 0 silent.
# History (docs/crashed.md keeps the one-shot figures): held-out 1 (heldout-a/-b.toml) was scored once
# on 2026-12-01 (30/48 SM12x right, 1 false alarm, 8 silent), looked at a second time (34/48, 1, 6);
# held-out 2 (heldout-c.toml) was scored once (42/48, 0, 3). Both were then opened for development: the
# cases they missed were read and their causes fixed by general changes (fatal-line families, cues), so
# from then on they are in-sample and held to the targets like the dev part.
# Held-out 3 (heldout-d*/-e*.toml) was scored once, 2026-12-01 ~12:05 UTC, on the merged tree (commit
# 26a265c): 36/50 SM12x right (72.0%), 1 false alarm, 3 silent, none of the targets met (docs/crashed.md keeps
# those figures). It was then opened for development (fourth round): the families it missed were fixed by
# general changes (44/50, 0, 0 after them), so it is held to the targets like the other opened parts, and its
# one-shot misses are no longer strict xfails.
# Held-out 4 (heldout-f*/-g*.toml) was scored once, 2026-12-01 12:25 UTC, on the merged tree (the commit after
# 87b4b5e that drops one URL both collectors took): 38/48 SM12x right (79.2%), 0 false alarms, 0 silent (two
# targets met, SM12x right one case short). It was then opened for development (fifth round): the families it
# missed were fixed by general changes (46/48, 0, 0 after them), so it is held to the targets like the other
# opened parts.
# Held-out 5 (heldout-h*/-i*.toml) was scored once, 2026-12-01 13:01 UTC, on the merged tree (10207ce, less one URL
# both collectors took): 32/37 SM12x right (86.5%), 0 false alarms, 5 silent (docs/crashed.md keeps those figures).
# It was then opened for development (sixth round): the families of its five silent logs (bare one-line loader
# errors, CUDA runtime error strings, containers built for another CPU) were fixed by general changes (33/37, 0,
# 0 after them), so it is held to the targets like the other opened parts and its strict xfails are gone.
# Held-out 6 (heldout-j*/-k*.toml) was scored once, 2026-12-01 14:31 UTC, on the merged tree (a86669d): 32/38
# SM12x right (84.2%), 0 false alarms, 2 silent (docs/crashed.md keeps those figures). It was then opened for
# development (seventh round): the families of its two silent logs (a C++ engine's bare "not implemented: ..."
# with "Aborted" glued on, the remedy half of a build-mismatch message) were fixed by general changes (34/38, 0, 0
# after them), so it is held to the targets like the other opened parts and its strict xfails are gone.
# Held-out 7 (heldout-l*/-m*.toml) was scored once, 2026-12-01 14:57 UTC, on the merged tree (bb9478b): 27/31
# SM12x right (87.1%), 0 false alarms, 1 silent (docs/crashed.md keeps those figures). The met targets stay
# asserted. It was then opened for development (eighth round): the family of its silent log (a version mismatch
# between two installed components, a runtime with nothing registered for an op) was fixed by a general change,
# so it is held to the targets like the other opened parts and its strict xfail is gone.
# Held-out 8 (heldout-n*/-o*.toml) was scored once, 2026-12-01 15:07 UTC, on the merged tree (fd4d68f): 18/20
# SM12x right (90.0%), 0 false alarms, 1 silent (docs/crashed.md keeps those figures). It was then opened for
# development (ninth round): the family of its silent log (an op that failed with an absl status code, logged at
# TensorFlow's W level) was fixed by a general change, so it is held to the targets like the other opened parts and
# its strict xfail is gone.
# Held-out 9 (heldout-p*/-q*.toml) was scored once, 2026-12-01 15:21 UTC, on the merged tree (9566f62): 6/9 SM12x
# right (66.7%), 1 false alarm, 0 silent (docs/crashed.md keeps those figures; the tree before the ninth round,
# 69cb398, scored the same). "0 silent" is met and asserted; the floor is the measured share and the false alarm a
# strict xfail (a later general change that fixes it makes the test say so).
# It was then opened for development (tenth round, no new blind set: in-sample from here on): the family of its
# false alarm (the shell's report of a host SIGILL, `Illegal instruction`, read as a CUDA kernel fault) and of one
# SM12x miss (`Value 'sm_120' is not defined for option 'gpu-architecture'` from any CUDA tool) were fixed by
# general changes: 7/9, 0 false alarms, 0 silent after them. 7/9 (77.8%) is still short of the 80% target, so its
# floor is the in-sample figure (the one-shot 6/9 stays in docs/crashed.md) and it is not held to the target yet.
ISSUE_23_HELDOUT_TARGET = 0.80
HELDOUT9_FLOOR = 7 / 9  # one-shot: 6/9; opened, in-sample after the tenth round: 7/9, short of the target
HELDOUT9_FALSE_ALARMS: frozenset[str] = frozenset()  # one-shot: 1 (a host SIGILL); fixed in the tenth round
HELDOUT9_SILENT: frozenset[str] = frozenset()  # met: none
# Held-out 10 (heldout-r*..-x*.toml: blogs, forums, Q&A, non-English pages, three GitHub partitions) was collected
# blind on 2026-12-04 and scored once, 18:44 UTC, on 1806073: 17/21 SM12x right (81.0%), 0 false alarms, 3 silent
# (docs/crashed.md keeps those figures). The SM12x target is met and asserted; its silent logs are strict xfails
# (not tuned for: a general change that answers them makes the test say so).
HELDOUT10_SILENT = frozenset(
    [
        "wizdelight-framepack-checkpoint-shards-pagefile",
        "jishuzhan-vllm-swift-port-in-use",
        "gpustack-1755-5080-llama-box-archs-lack-120",
    ]
)
# Held-out 11 (heldout-y*.toml): six GitHub partitions collected blind on 2026-12-04 and scored once, 21:23 UTC, on
# 582135a: 4/15 SM12x right (26.7%), 0 false alarms, 3 silent (docs/crashed.md keeps those figures); most of its
# SM12x excerpts end before their error line (the stored copies are cut; each case's note says so). Opened after
# that: 7/15 in-sample, held as the floor (exactly what is measured, so a gain must raise it); its silent logs
# are strict xfails.
HELDOUT11_FLOOR = 7 / 15
HELDOUT11_SILENT = frozenset(
    [
        "flashinfer-3493-rtxpro6000-mixed-cuda-headers",
        "isaacsim-671-isaac45-iray-cc120-unsupported",
        "isaacsim-517-crash-after-driver-update-595",
    ]
)
# Held-out 12 (heldout-z*.toml): seven partitions collected blind on 2026-12-06 under a contract that wants the
# error line in every excerpt, scored once, 05:03 UTC, on 718bfd6: 9/12 SM12x right (75.0%), 37/46 others right,
# 0 false alarms, 1 silent (docs/crashed.md keeps those figures). The floor is the measured share; its silent log
# is a strict xfail.
# Opened after that (a 12.1 GPU past a 12.0 PyTorch build is a warning; a build naming the CUDA a capability needs;
# CUDA that did not start under PyTorch, error 803): 11/12 in-sample, its silent log answered.
HELDOUT12_FLOOR = 11 / 12
HELDOUT12_SILENT: frozenset[str] = frozenset()
PART_TARGETS = {
    "dev": 0.90,
    "held-out": ISSUE_23_HELDOUT_TARGET,  # opened for development after its one-shot score
    "held-out-2": ISSUE_23_HELDOUT_TARGET,  # opened for development after its one-shot score
    "held-out-3": ISSUE_23_HELDOUT_TARGET,  # opened for development after its one-shot score (72%: missed)
    "held-out-4": ISSUE_23_HELDOUT_TARGET,  # opened for development after its one-shot score (79.2%: missed)
    "held-out-5": ISSUE_23_HELDOUT_TARGET,  # opened for development after its one-shot score (5 silent: missed)
    "held-out-6": ISSUE_23_HELDOUT_TARGET,  # opened for development after its one-shot score (2 silent: missed)
    "held-out-7": ISSUE_23_HELDOUT_TARGET,  # opened for development after its one-shot score (1 silent: missed)
    "held-out-8": ISSUE_23_HELDOUT_TARGET,  # opened for development after its one-shot score (1 silent: missed)
    "held-out-9": HELDOUT9_FLOOR,  # opened after its one-shot score (6/9, 1 false alarm); 7/9 in-sample
    "held-out-10": ISSUE_23_HELDOUT_TARGET,  # one shot: 17/21 (81.0%), met; opened: 19/21
    "held-out-11": HELDOUT11_FLOOR,  # one shot: 4/15 (26.7%), missed; opened: 7/15
    "held-out-12": ISSUE_23_HELDOUT_TARGET,  # one shot: 9/12 (75.0%), short of the 80% target; opened: 11/12
}
# A log with no failure in it (the case's own note: a warning in a healthy startup log): exit 0 with
# "no fatal lines" is diagnose's documented answer for it, and a healthy log with scary warnings must stay
# exit 0 (test_diagnose_classes.py), so it stays "silent" by the corpus's count. Not a one-shot miss.
# unsloth-3898 (dev, note "A warning and fallback, not a crash.") and pytorch-172629 (held-out 1, "A warning, not a
# crash"): their only CUDA line is PyTorch's warning that a 12.1 GPU is past its build's 12.0, which its sm_120 code
# runs; since that value is a warning (signatures.toml's by_value fatal = false), neither log shows a failure, and
# exit 0 with the warning explained is the answer.
NO_FAILURE_IN_LOG = frozenset(
    [
        "discuss-vllm-1603-5090-xformers-not-available-warning",
        "unsloth-3898-gb10-flash-attn-broken-fallback",
        "pytorch-172629-gb10-capability-warning-false-positive",
    ]
)
KNOWN = {
    "held-out-2": (frozenset(), NO_FAILURE_IN_LOG),
    "held-out-9": (HELDOUT9_FALSE_ALARMS, HELDOUT9_SILENT),
    "held-out-10": (frozenset(), HELDOUT10_SILENT),
    "held-out-11": (frozenset(), HELDOUT11_SILENT),
    "held-out-12": (frozenset(), HELDOUT12_SILENT),
}


def _by_id(sm12x: bool) -> list[Case]:
    return [c for c in CASES if c.sm12x is sm12x]


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Outcome]:
    return {o.case.id: o for o in score(CASES).outcomes}


def test_corpus_is_big_enough_and_balanced() -> None:
    assert len(CASES) >= 80
    assert len(_by_id(False)) >= len(CASES) / 4
    assert {c.framework for c in CASES} >= {"sglang", "vllm", "pytorch", "triton", "tensorrt-llm", "flashinfer"}


def test_every_expected_id_is_in_the_catalogue() -> None:
    from sm120patch.triage.signatures import load_signatures

    ids = {s.id for s in load_signatures()}
    for c in CASES:
        assert set(c.expect) <= ids, f"{c.id}: {sorted(set(c.expect) - ids)} is not in the catalogue"
        assert c.expect or c.part != "seed", f"{c.id}: a seed case names the catalogue id of its cause"


def _known(cases: list[Case], missed: frozenset[str], what: str) -> list[object]:
    """Cases, with the ones a one-shot score missed (and the log without a failure) as strict xfails."""

    def reason(c: Case) -> str:
        if c.id in NO_FAILURE_IN_LOG:
            return "the log shows no failure (its own note); exit 0 is diagnose's answer for a healthy log"
        part = (
            "held-out-12"
            if c.id in HELDOUT12_SILENT
            else "held-out-11"
            if c.id in HELDOUT11_SILENT
            else "held-out-10"
            if c.id in HELDOUT10_SILENT
            else "held-out-9"
        )
        return f"{part}, scored once and not tuned for: {what} (docs/crashed.md)"

    return [
        pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=reason(c))) if c.id in missed else c for c in cases
    ]


@pytest.mark.parametrize(
    "case",
    _known(
        CASES,
        HELDOUT9_SILENT | HELDOUT10_SILENT | HELDOUT11_SILENT | HELDOUT12_SILENT | NO_FAILURE_IN_LOG,
        "answered with silence",
    ),
    ids=lambda c: c.id,
)
def test_no_fatal_log_is_answered_with_silence(case: Case, outcomes: dict[str, Outcome]) -> None:
    o = outcomes[case.id]
    assert not o.silent, f"{case.url}: exit 0 with nothing named"


@pytest.mark.parametrize("case", _known(_by_id(False), HELDOUT9_FALSE_ALARMS, "blamed on SM12x"), ids=lambda c: c.id)
def test_other_crashes_are_never_blamed_on_sm12x(case: Case, outcomes: dict[str, Outcome]) -> None:
    o = outcomes[case.id]
    assert not o.blamed, f"{case.url} ({case.gpu}): blamed on SM12x; named {o.named}"


def test_sm12x_recall_meets_the_target(outcomes: dict[str, Outcome]) -> None:
    pos = [outcomes[c.id] for c in _by_id(True) if c.part == "seed"]
    right = [o for o in pos if o.right_with_fix]
    missed = [f"{o.case.id} (named {o.named}, fix ok {o.fix_ok})" for o in pos if not o.right_with_fix]
    assert len(right) / len(pos) >= RECALL_TARGET, missed


def test_blame_on_sm12x_comes_from_sm12x_cases_only(outcomes: dict[str, Outcome]) -> None:
    blamed = [o for o in outcomes.values() if o.blamed and o.case.id not in HELDOUT9_FALSE_ALARMS]
    assert blamed and all(o.case.sm12x for o in blamed)


def test_advice_is_in_the_framework_of_the_log() -> None:
    """A vLLM OOM gets vLLM's memory flag, never SGLang's (a complaint in issue 13)."""
    vllm_oom = next(c for c in CASES if c.id == "vllm-27508-h100-gpt-oss-120b-oom")
    sglang_oom = next(c for c in CASES if c.id == "sglang-12496-24gb-oom-kv-pool")
    v, s = run_case(vllm_oom), run_case(sglang_oom)
    assert v.framework == "vllm" and s.framework == "sglang"
    from sm120patch.triage.diagnose import diagnose

    def step(case: Case) -> str:
        d = diagnose(case.excerpt.splitlines(keepends=True), [], None)
        return next(f.next_step for f in d.findings if f.signature == "cuda-out-of-memory")

    assert "--gpu-memory-utilization" in step(vllm_oom) and "--mem-fraction-static" not in step(vllm_oom)
    assert "--mem-fraction-static" in step(sglang_oom) and "--gpu-memory-utilization" not in step(sglang_oom)


def test_spark_ptxas_advice_names_triton_ptxas_path(outcomes: dict[str, Outcome]) -> None:
    assert outcomes["triton-8539-spark-ptxas-sm121a"].fix_ok


def test_corpus_schema_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('[[case]]\nid = "x"\ncolour = "red"\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"^bad.toml: case\[0\].colour: unknown key"):
        load_corpus(tmp_path)
    (tmp_path / "bad.toml").write_text('[[case]]\nid = "x"\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"case\[0\].url: missing"):
        load_corpus(tmp_path)


@pytest.mark.parametrize("part", sorted(PART_TARGETS))
def test_each_part_meets_issue_23_targets(part: str, outcomes: dict[str, Outcome]) -> None:
    mine = [o for o in outcomes.values() if o.case.part == part]
    if not mine:
        one_shot = ONE_SHOT_FILES.get(part)
        files = ", ".join(f"{f}*.toml" for f in one_shot) if one_shot else f"the {part} files"
        pytest.skip(f"no {part} cases in tests/corpus/triage/ yet ({files}: collected blind, merged once, then scored)")
    pos = [o for o in mine if o.case.sm12x]
    right = [o for o in pos if o.sm12x_right]
    missed = [f"{o.case.id} (named {o.named})" for o in pos if not o.sm12x_right]
    assert len(right) / len(pos) >= PART_TARGETS[part] - 1e-9, missed
    known_fa, known_silent = KNOWN.get(part, (frozenset(), frozenset()))
    assert {o.case.id for o in mine if not o.case.sm12x and o.blamed} <= known_fa
    assert {o.case.id for o in mine if o.silent} <= known_silent | NO_FAILURE_IN_LOG


def test_heldout_floors_are_the_targets_or_say_so(outcomes: dict[str, Outcome]) -> None:
    """Kept honest: the opened held-out parts (1 to 8) are held to the targets; no part is a one-shot set any
    more. Held-out 9, opened in the tenth round, is still short of the SM12x target (7/9 in-sample): its floor is
    that measured figure (below the target, never above what was measured), and its 0 false alarms and 0 silent
    are asserted like every other part's."""
    opened = ("held-out", "held-out-2", "held-out-3", "held-out-4", "held-out-5", "held-out-6", "held-out-7")
    opened += ("held-out-8",)
    assert all(PART_TARGETS[p] == ISSUE_23_HELDOUT_TARGET for p in opened)
    assert HELDOUT9_FLOOR <= ISSUE_23_HELDOUT_TARGET
    assert not (HELDOUT9_SILENT | HELDOUT9_FALSE_ALARMS) or any(c.part == "held-out-9" for c in CASES)
    assert set(KNOWN) == {"held-out-2", "held-out-9", "held-out-10", "held-out-11", "held-out-12"}
    assert len(NO_FAILURE_IN_LOG) == 3
    pos11 = [o for o in outcomes.values() if o.case.part == "held-out-11" and o.case.sm12x]
    assert HELDOUT11_FLOOR <= ISSUE_23_HELDOUT_TARGET
    assert pos11 and abs(sum(o.sm12x_right for o in pos11) / len(pos11) - HELDOUT11_FLOOR) < 1e-9, (
        f"held-out-11 measures {sum(o.sm12x_right for o in pos11)}/{len(pos11)}; its floor says {HELDOUT11_FLOOR:.3f}"
    )
    pos12 = [o for o in outcomes.values() if o.case.part == "held-out-12" and o.case.sm12x]
    assert pos12 and abs(sum(o.sm12x_right for o in pos12) / len(pos12) - HELDOUT12_FLOOR) < 1e-9, (
        f"held-out-12 measures {sum(o.sm12x_right for o in pos12)}/{len(pos12)}; its floor says {HELDOUT12_FLOOR:.3f}"
    )
    # the floor below the target is what the corpus measures now (the cases' own labels, scored), not a
    # number that could sink unnoticed: exactly the measured figure, so a gain must raise it
    pos = [o for o in outcomes.values() if o.case.part == "held-out-9" and o.case.sm12x]
    if HELDOUT9_FLOOR < ISSUE_23_HELDOUT_TARGET:
        assert pos and abs(sum(o.sm12x_right for o in pos) / len(pos) - HELDOUT9_FLOOR) < 1e-9, (
            f"held-out-9 measures {sum(o.sm12x_right for o in pos)}/{len(pos)}; its floor says {HELDOUT9_FLOOR:.3f}"
        )


@pytest.mark.parametrize(
    ("part", "files"),
    [
        ("held-out-3", ("heldout-d", "heldout-e")),
        ("held-out-4", ("heldout-f", "heldout-g")),
        ("held-out-5", ("heldout-h", "heldout-i")),
        ("held-out-6", ("heldout-j", "heldout-k")),
        ("held-out-7", ("heldout-l", "heldout-m")),
        ("held-out-8", ("heldout-n", "heldout-o")),
        ("held-out-9", ("heldout-p", "heldout-q")),
        ("held-out-10", ("heldout-r", "heldout-s", "heldout-t", "heldout-u", "heldout-v", "heldout-w", "heldout-x")),
        ("held-out-11", ("heldout-y",)),
        ("held-out-12", ("heldout-z",)),
    ],
)
def test_the_blind_parts_follow_their_files(part: str, files: tuple[str, ...]) -> None:
    """heldout-d*/-e*.toml score as held-out-3, heldout-f*/-g*.toml as held-out-4, heldout-h*/-i*.toml as
    held-out-5, heldout-j*/-k*.toml as held-out-6, heldout-l*/-m*.toml as held-out-7, heldout-n*/-o*.toml as
    held-out-8, heldout-p*/-q*.toml as held-out-9, heldout-r*..-x*.toml as held-out-10, heldout-y*.toml as held-out-11,
    heldout-z*.toml as held-out-12, and nowhere else; until a
    part's files exist it is empty (and test_each_part_meets_issue_23_targets skips it, saying why)."""
    mine = [c for c in CASES if c.part == part]
    assert all(c.source.startswith(files) for c in mine)
    assert not [c for c in CASES if c.source.startswith(files) and c.part != part]
    if not mine:
        pytest.skip(f"no {' / '.join(f + '*.toml' for f in files)} yet: {part} is merged once, then scored")
    assert all(not c.expect for c in mine), f"{part} is collected blind: expect = [] on every case"


def test_new_cases_carry_class_and_source_and_come_from_more_than_github() -> None:
    new = [c for c in CASES if c.part != "seed"]
    if not new:
        pytest.skip("no dev-*/heldout-* cases yet")
    assert {c.origin for c in new} - {"github"}, "the new parts must use sources beyond GitHub"
    assert {c.framework for c in new} - {c.framework for c in CASES if c.part == "seed"}


def test_right_cause_counts_the_class_or_the_id() -> None:
    case = next(c for c in CASES if c.sm12x and c.expect)
    by_id = Outcome(case, [case.expect[0]], False, 0, True, None, findings=[(case.expect[0], "other", "maybe")])
    by_class = Outcome(case, ["class:x"], False, 1, False, None, findings=[("class:x", case.cls, "maybe")])
    denied = Outcome(case, ["class:x"], False, 1, False, None, findings=[("class:x", case.cls, "no")])
    wrong = Outcome(case, ["class:x"], False, 1, False, None, findings=[("class:x", "out-of-memory", "yes")])
    assert by_id.sm12x_right and by_class.sm12x_right
    assert not denied.sm12x_right and not wrong.sm12x_right


def test_parts_follow_the_file_names(tmp_path: Path) -> None:
    case = (
        '[[case]]\nid = "x"\nurl = "https://example.org/t/1"\ngpu = "RTX 5090"\nframework = "vllm"\n'
        'sm12x = true\nclass = "binary-lacks-arch"\nsource = "reddit"\ncause = "c"\nfix = "f"\nexpect = []\n'
        "excerpt = 'RuntimeError: CUDA error: no kernel image is available for execution on the device'\n"
    )
    names = ("dev-x.toml", "heldout-b9.toml", "heldout-c.toml", "heldout-d.toml", "heldout-e2.toml", "heldout-f.toml")
    more = ("heldout-g2.toml", "heldout-h.toml", "heldout-i3.toml", "heldout-j.toml", "heldout-k2.toml")
    more += ("heldout-l.toml", "heldout-m2.toml", "heldout-n.toml", "heldout-o2.toml", "heldout-p.toml")
    more += ("heldout-q2.toml", "heldout-r.toml", "heldout-x2.toml", "heldout-y3.toml", "heldout-z4.toml")
    for name in (*names, *more, "sm12x.toml"):
        (tmp_path / name).write_text(case.replace('id = "x"', f'id = "{name}"').replace("/1", f"/{name}"))
    parts = {c.source: c.part for c in load_corpus(tmp_path)}
    assert parts == {
        "dev-x.toml": "dev",
        "heldout-b9.toml": "held-out",
        "heldout-c.toml": "held-out-2",
        "heldout-d.toml": "held-out-3",
        "heldout-e2.toml": "held-out-3",
        "heldout-f.toml": "held-out-4",
        "heldout-g2.toml": "held-out-4",
        "heldout-h.toml": "held-out-5",
        "heldout-i3.toml": "held-out-5",
        "heldout-j.toml": "held-out-6",
        "heldout-k2.toml": "held-out-6",
        "heldout-l.toml": "held-out-7",
        "heldout-m2.toml": "held-out-7",
        "heldout-n.toml": "held-out-8",
        "heldout-o2.toml": "held-out-8",
        "heldout-p.toml": "held-out-9",
        "heldout-q2.toml": "held-out-9",
        "heldout-r.toml": "held-out-10",
        "heldout-x2.toml": "held-out-10",
        "heldout-y3.toml": "held-out-11",
        "heldout-z4.toml": "held-out-12",
        "sm12x.toml": "seed",
    }
    (tmp_path / "dev-x.toml").write_text(case.replace("binary-lacks-arch", "out-of-memory"))
    with pytest.raises(CorpusError, match="an SM12x case needs an SM12x architecture class"):
        load_corpus(tmp_path)
