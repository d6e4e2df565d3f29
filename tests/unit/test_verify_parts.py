"""verify's parts on data written here: bench_serving's formulas worked by hand, the answer
tolerance on texts of both kinds, the interleaving, the keep rule, the records and the prompt set."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from sm120patch.catalogue.recipes import load_recipe, load_recipes
from sm120patch.errors import UserError
from sm120patch.verify import answers, decide, metrics, record, report, schedule
from sm120patch.verify.workload import Load, Prompt, RequestResult, load_prompts

COUNT = ", ".join(str(i) for i in range(1, 31))


# --- metrics: bench_serving's definitions --------------------------------------------------------


def test_percentile_is_numpys_linear_interpolation() -> None:
    # np.percentile([1, 2, 3, 4], 99) = 1 + 0.99 * 3 = 3.97; p50 = 2.5; one value is itself
    assert metrics.percentile([4.0, 1.0, 3.0, 2.0], 99) == pytest.approx(3.97)
    assert metrics.percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert metrics.percentile([7.0], 99) == 7.0 and metrics.percentile([], 99) == 0.0


def test_summary_follows_calculate_metrics() -> None:
    ok1 = RequestResult("a", True, "x", ttft=0.1, itl=[0.02, 0.04], latency=0.5, output_len=5)
    ok2 = RequestResult("b", True, "y", ttft=0.3, itl=[0.06], latency=0.7, output_len=3)
    bad = RequestResult("c", False, error="HTTP 500: boom", output_len=9)
    s = metrics.summarize(Load(4, [ok1, ok2, bad], duration=2.0))
    assert (s["completed"], s["failed"], s["output_tokens"]) == (2, 1, 8)
    assert s["output_throughput"] == pytest.approx(4.0)  # 8 tokens / 2 s; the failed one counts 0
    # TPOT = (latency - ttft) / (output_len - 1): 0.4/4 = 100 ms and 0.4/2 = 200 ms
    assert s["tpot_ms"]["median"] == pytest.approx(150.0) and s["tpot_ms"]["mean"] == pytest.approx(150.0)
    assert s["ttft_ms"]["median"] == pytest.approx(200.0) and s["ttft_ms"]["std"] == pytest.approx(100.0)
    assert s["itl_ms"]["median"] == pytest.approx(40.0)  # every gap of every request: 20, 40, 60
    assert s["e2e_ms"]["p99"] == pytest.approx(500 + 0.99 * 200)
    assert s["errors"] == ["HTTP 500: boom"]


# --- answers: the tolerance ----------------------------------------------------------------------


def test_collapse_is_one_short_unit_repeated() -> None:
    assert "'!'" in answers.collapse(" 42." + "!" * 40)
    assert answers.collapse("") == "empty output" and answers.collapse("   \n") == "empty output"
    assert answers.collapse(COUNT) is None
    assert answers.collapse("The cache stores keys. " * 10) is None  # a greedy sentence loop is not a collapse
    assert answers.collapse("ab " * 16) is not None and answers.collapse("ab " * 15) is None


def test_late_divergence_agrees_early_or_collapsed_does_not() -> None:
    base = "The lamp was converted in 1904, and the family climbed 112 steps to the top every night."
    late = base[:60] + " each evening, carrying oil."
    early = base[:20] + " something else entirely happened to the lighthouse and its keepers."
    assert answers.compare(base, base) == {
        "exact": True, "prefix_chars": len(base), "prefix_fraction": 1.0, "first_divergence": None,
        "collapse": None, "agree": True, "by": "characters",
    }  # fmt: skip
    assert answers.compare(base, late)["agree"] and answers.compare(base, late)["first_divergence"] == 60
    assert not answers.compare(base, early)["agree"]
    collapsed = answers.compare(base, base[:70] + "!" * 30)  # late, but a collapse: #4841
    assert not collapsed["agree"] and collapsed["collapse"]


def test_tokens_decide_where_both_runs_carry_them() -> None:
    # one long token, then two short ones: by characters the candidate keeps 100 of 102 (late, agrees);
    # greedy decoding parted at the second of three tokens (early, disagrees)
    base, cand = ["x" * 100, "y", "z"], ["x" * 100, "q", "r"]
    by_chars = answers.compare("".join(base), "".join(cand))
    assert by_chars["by"] == "characters" and by_chars["agree"] and by_chars["first_divergence"] == 100
    by_toks = answers.compare("".join(base), "".join(cand), base, cand)
    assert by_toks["by"] == "tokens" and not by_toks["agree"]
    assert by_toks["first_divergent_token"] == 1 and by_toks["token_agreement"] == pytest.approx(1 / 3)
    same = answers.compare("ab", "ab", [1, 2], [1, 2])
    assert same["exact"] and same["first_divergent_token"] is None and same["token_agreement"] == 1.0
    # a prompt whose tokens only one run carries is compared by characters; the set says "mixed"
    texts = {"count": COUNT, "poem": GOOD["poem"]}
    toks = {"count": [COUNT], "poem": [GOOD["poem"]]}
    assert answers.compare_sets(PROMPTS, texts, texts, toks, toks)["by"] == "tokens"
    mixed = answers.compare_sets(PROMPTS, texts, texts, toks, {"count": [COUNT]})
    assert mixed["by"] == "mixed" and mixed["by_tokens"] == 1
    assert answers.compare_sets(PROMPTS, texts, texts)["by"] == "characters"


def test_the_summary_says_how_answers_were_compared() -> None:
    toks = {"count": [COUNT], "poem": [GOOD["poem"]]}
    by_toks = {8: {**run(100, GOOD)[8], "tokens": toks}}
    d = decide.decide("r", ["r"], PROMPTS, [by_toks], [by_toks])
    assert d.answers["by"] == "by tokens" and "answers agree 2/2 by tokens" in d.summary
    d = decide.decide("r", ["r"], PROMPTS, [run(100, GOOD)], [run(100, GOOD)])
    assert d.answers["by"] == "by characters" and "answers agree 2/2 by characters" in d.summary
    half = {8: {**run(100, GOOD)[8], "tokens": {"count": [COUNT]}}}
    d = decide.decide("r", ["r"], PROMPTS, [half], [half])
    assert d.answers["by"] == "by tokens for 1 of 2, characters for the rest"


def test_a_streamed_chunk_names_its_tokens_only_when_it_carries_them() -> None:
    from sm120patch.verify.workload import chunk_tokens, payload

    assert chunk_tokens({"text": " 42", "logprobs": {"tokens": [" 4", "2"], "token_logprobs": [0, 0]}}) == [" 4", "2"]
    assert chunk_tokens({"text": " 42"}) is None and chunk_tokens({"text": "", "logprobs": None}) is None
    assert chunk_tokens({"logprobs": {"tokens": "not a list"}}) is None
    assert payload("m", "p", 4, logprobs=True)["logprobs"] == 0 and "logprobs" not in payload("m", "p", 4)


def test_a_collapse_the_baseline_shows_too_is_not_new() -> None:
    looped = "ok " + "!" * 30
    assert answers.compare(looped, looped)["collapse"] is None


def test_known_answer_is_a_whole_word_near_the_start() -> None:
    p = Prompt("p", "short", "Compute 17 + 25.", answer="42")
    assert answers.known_answer_ok(p, " 42.") and not answers.known_answer_ok(p, " 142.")
    assert not answers.known_answer_ok(p, " x" * 150 + " 42")  # past ANSWER_WINDOW
    assert answers.known_answer_ok(Prompt("q", "short", "hi"), "anything") is None


# --- schedule and the keep rule ------------------------------------------------------------------


def arms(steps: list[schedule.Step]) -> str:
    return " ".join("A" if s.arm == schedule.BASELINE else s.arm for s in steps)


def test_interleaving_brackets_every_candidate_with_the_baseline() -> None:
    assert arms(schedule.interleave(["B"], 1)) == "A B A"
    assert arms(schedule.interleave(["B"], 2)) == "A B A B A"
    assert arms(schedule.interleave(["x", "y"], 1)) == "A x A y A"
    with pytest.raises(ValueError):
        schedule.interleave(["B"], 0)


def test_noise_is_twice_the_standard_error_with_a_floor() -> None:
    assert schedule.spread([90.0, 110.0]) == pytest.approx(0.1)
    # pooled s = sqrt((10^2 + 10^2) / 1) = 14.14; SE = s * sqrt(1/2 + 1/1) = 17.32; 2 SE / 100
    c = schedule.compare([90.0, 110.0], [92.0])
    assert c["delta"] == pytest.approx(-0.08) and c["noise"] == pytest.approx(0.3464, abs=1e-4) and not c["worse"]
    # s = sqrt((0 + 4 + 4 + 0.25 + 0.25) / 3) = 1.683; SE = s * sqrt(1/3 + 1/2) = 1.537: noise 3.07 %
    c = schedule.compare([100.0, 102.0, 98.0], [96.0, 97.0])
    assert c["noise"] == pytest.approx(0.03073, abs=1e-4) and c["delta"] == pytest.approx(-0.035) and c["worse"]
    assert schedule.compare([100.0, 100.0], [97.0])["worse"]  # no scatter: -3 % is beyond the 2 % floor
    assert not schedule.compare([100.0], [99.0])["worse"]  # one run each: the floor alone
    assert not schedule.compare([100.0, 100.0], [97.0], floor=0.05)["worse"]


def run(tok_s: float, outputs: dict[str, str], failed: int = 0) -> dict[int, dict[str, Any]]:
    return {8: {"summary": {"output_throughput": tok_s, "completed": 8, "failed": failed}, "outputs": outputs}}


PROMPTS = [Prompt("count", "short", "Count", answer="1, 2, 3"), Prompt("poem", "short", "Poem")]
GOOD = {"count": COUNT, "poem": "A card that runs too hot, a fan that never stops."}


def test_keep_when_not_slower_and_answers_agree() -> None:
    d = decide.decide("r", ["r"], PROMPTS, [run(100, GOOD), run(104, GOOD)], [run(180, GOOD)])
    assert d.keep and d.reasons == [] and "+76% output tok/s at c=8" in d.summary and "agree 2/2" in d.summary


def test_rollback_when_slower_failing_or_collapsed() -> None:
    slow = decide.decide("r", ["r"], PROMPTS, [run(100, GOOD), run(102, GOOD)], [run(33, GOOD)])
    assert not slow.keep and slow.reasons[0].startswith("slower: -67% output tok/s at c=8")
    failing = decide.decide("r", ["r"], PROMPTS, [run(100, GOOD)], [run(100, GOOD, failed=3)])
    assert not failing.keep and "3 requests failed" in failing.reasons[0]
    bad = {"count": "1, 2" + "!" * 40, "poem": GOOD["poem"]}
    broken = decide.decide("r", ["r"], PROMPTS, [run(100, GOOD)], [run(130, bad)])
    assert not broken.keep and any("collapsed" in r for r in broken.reasons)
    assert any("known answers 0/1 (baseline 1)" in r for r in broken.reasons)


def test_a_baseline_that_disagrees_with_itself_lowers_the_bar() -> None:
    other = {"count": COUNT, "poem": "Something else from the first word."}
    base = [run(100, GOOD), run(100, other)]  # the server alone agrees 1 of 2
    d = decide.decide("r", ["r"], PROMPTS, base, [run(100, other)])
    assert d.answers["required_rate"] == 0.5 and d.keep
    strict = decide.decide("r", ["r"], PROMPTS, [run(100, GOOD), run(100, GOOD)], [run(100, other)])
    assert not strict.keep and "below 90%" in strict.reasons[-1]


def test_a_launch_failure_is_a_rollback_with_its_cause() -> None:
    d = decide.decide("r", ["r"], PROMPTS, [run(100, GOOD)], [], {"outcome": "crashed", "cause": "X (recipes: r)"})
    assert not d.keep and d.summary == "server crashed with it: X (recipes: r)"


# --- records, report, prompt set, recipe key -----------------------------------------------------


def test_records_round_trip_and_a_damaged_file_is_ignored(tmp_path: Path) -> None:
    d = decide.decide("r", ["r"], PROMPTS, [run(100, GOOD)], [run(33, GOOD)]).to_dict()
    path = record.write(tmp_path, [d], "rep.md")
    assert path == tmp_path / ".sm120patch" / "verify.json"
    recs = record.read(tmp_path)
    assert recs["r"]["kept"] is False and recs["r"]["report"] == "rep.md"
    assert record.status_lines(recs, []) == [f"verified r: rolled back: {d['summary']}"]
    path.write_text("{not json")
    assert record.read(tmp_path) == {}


def test_report_writes_json_and_markdown_and_plots_only_with_matplotlib(tmp_path: Path) -> None:
    def measured(duration: float) -> dict[str, Any]:  # 20 tokens in `duration` seconds
        one = RequestResult("count", True, COUNT, ttft=0.1, itl=[0.01], latency=0.2, output_len=20)
        return {"summary": metrics.summarize(Load(8, [one], duration)), "outputs": GOOD}

    base, cand = measured(0.2), measured(0.2 / 1.8)
    d = decide.decide("r", ["r"], PROMPTS, [{8: base}], [{8: cand}]).to_dict()
    result = {
        "options": {"command": ["srv"], "url": "u", "concurrencies": [8], "output_len": 16, "repeats": 1},
        "schedule": [{"arm": "baseline"}, {"arm": "r"}, {"arm": "baseline"}],
        "runs": {"baseline": [{"8": base}], "r": [{"8": cand}]},
        "decisions": [d],
        "launches": [],
    }
    paths = report.write(result, tmp_path)
    assert json.loads(Path(paths["json"]).read_text())["decisions"][0]["keep"] is True
    md = Path(paths["markdown"]).read_text()
    assert "| r | r | kept |" in md and "| r | 8 | 180.0 | +80.0% |" in md and "order A B A (A = baseline, B = r)" in md
    assert ("plot" in paths) == (importlib.util.find_spec("matplotlib") is not None)


def test_shipped_prompt_set() -> None:
    prompts = load_prompts()
    assert {p.kind for p in prompts} == {"short", "long"}
    assert len({p.id for p in prompts}) == len(prompts) and sum(p.answer is not None for p in prompts) >= 4
    (canary,) = [p for p in prompts if p.canary]
    assert answers.known_answer_ok(canary, COUNT) and not answers.known_answer_ok(canary, "1, 2, !!!!!!!")
    assert all(p.text.isascii() for p in prompts)


def test_bad_prompt_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text("[[prompt]]\nid = 1\n")
    with pytest.raises(UserError, match="p.toml: prompt\\[0\\] needs a string id"):
        load_prompts(tmp_path / "p.toml")


def test_changes_outputs_key(tmp_path: Path) -> None:
    by = {r.id: r for r in load_recipes()}
    assert by["sglang-autotune-flashinfer-cutlass"].changes_outputs == "tactics"
    assert by["sglang-autotune-moe-guard-sm120"].changes_outputs == ""  # closing a gate must not be undone
    src = by["sglang-autotune-flashinfer-cutlass"].path.read_text()
    bad = tmp_path / "sglang" / "sglang-autotune-flashinfer-cutlass.toml"
    bad.parent.mkdir()
    bad.write_text(src.replace('changes_outputs = "tactics"', 'changes_outputs = "maybe"'))
    with pytest.raises(UserError, match="changes_outputs: 'maybe' is not one of tactics, kernels"):
        load_recipe(bad)


# --- arms from the dependency graph, inconclusive verdicts ---------------------------------------

AR, FIX = "sglang-allreduce-fusion-sm120", "flashinfer-trtllm-comm-sm120"


def test_a_gate_is_measured_with_the_backport_it_stands_on() -> None:
    from sm120patch.verify import arms

    on = {AR: {FIX}}
    a = arms.build([FIX, AR, "autotune"], on, {FIX, AR, "autotune"}, one_at_a_time=True)
    assert a.arms == {AR: [AR, FIX], "autotune": ["autotune"]}  # the backport has no arm of its own
    assert "no arm of its own" in a.why[FIX] and "measured with flashinfer-trtllm-comm-sm120" in a.why[AR]
    # the backport alone named: the gate applied on it joins (rolling the backport back takes it along)
    b = arms.build([FIX], on, {FIX, AR}, one_at_a_time=True)
    assert b.candidates == [FIX, AR] and b.arms == {AR: [AR, FIX]} and "joined the candidates" in b.why[AR]
    # the gate alone named: the backport is not a candidate, it stays under every arm (the baseline too)
    assert arms.build([AR], on, {FIX, AR}, one_at_a_time=True).arms == {AR: [AR]}
    # together: one arm of everything, the dependents that joined included
    assert arms.build([FIX, "autotune"], on, {FIX, AR, "autotune"}, False).arms == {"all": [FIX, "autotune", AR]}


def test_noise_wider_than_the_min_effect_is_inconclusive() -> None:
    # +5 % with runs scattered +-15 %: it may be 10 % slower; the H200 no-op candidates
    base, cand = [run(100, GOOD), run(130, GOOD), run(85, GOOD)], [run(120, GOOD), run(90, GOOD)]
    d = decide.decide("r", ["r"], PROMPTS, base, cand)
    assert d.keep and d.verdict == "inconclusive, kept" and d.summary.startswith("inconclusive: noise +-")
    assert "wider than --min-effect 5%" in d.summary and "repeats" in d.summary and "--requests a load" in d.summary
    # by hand: means 105 and 105; ss = 25 + 625 + 400 + 225 + 225 = 1500 over 3 dof, s = 22.36, SE = s *
    # sqrt(1/3 + 1/2) = 20.41, noise = 2 SE / 105 = 38.9 %; runs needed = 2 x (0.389 / 0.05)^2 = 120.9
    assert d.throughput[8]["noise"] == pytest.approx(0.3888, abs=1e-3) and "about 121 repeats" in d.summary
    assert "+-39% at c=8" in d.summary and "(or about 484 --requests a load" in d.summary  # 8 x 60.46 = 483.7
    strict = decide.decide("r", ["r"], PROMPTS, base, cand, if_inconclusive="rollback")
    assert not strict.keep and strict.verdict == "inconclusive, rolled back"
    # the same noise with a candidate far faster than it is conclusive; a small noise is conclusive
    assert decide.decide("r", ["r"], PROMPTS, base, [run(300, GOOD), run(310, GOOD)]).verdict == "kept"
    calm = [run(100, GOOD), run(101, GOOD)]
    assert decide.decide("r", ["r"], PROMPTS, calm, [run(100, GOOD), run(100.5, GOOD)]).verdict == "kept"
    # a floor above min-effect cannot be narrowed by repeats: said so
    floor = decide.decide("r", ["r"], PROMPTS, [run(100, GOOD)], [run(98, GOOD)], noise_floor=0.1)
    assert "it is --noise-floor 10%" in floor.summary


def test_an_arm_that_cannot_be_built_is_left_as_it_was() -> None:
    why = {"outcome": "not built", "cause": "the arm could not be built (x: blocked: y); left as it was"}
    d = decide.decide("r", ["r"], PROMPTS, [run(100, GOOD)], [], why)
    assert d.keep and d.verdict == "left as it was" and d.summary.startswith("not judged:")


def test_group_search_finds_the_culprits_by_halving() -> None:
    from sm120patch.verify import groups

    arms = [f"r{i}" for i in range(8)]
    seen: list[list[str]] = []

    def breaks(bad: set[str]):  # noqa: ANN202
        return lambda s: seen.append(s) or bool(bad & set(s))

    one = groups.search(arms, breaks({"r5"}))
    # [r0..r3] clean, so r4..r7 holds it (not measured); [r4 r5] breaks; [r4] clean, so r5 (by
    # elimination); [r6 r7] is measured too (a second culprit may be there) and is clean
    assert one.culprits == ["r5"]
    assert one.tests == [["r0", "r1", "r2", "r3"], ["r4", "r5"], ["r4"], ["r6", "r7"]]
    assert one.inferred == {"r5": ["r4"]}
    two = groups.search(arms, breaks({"r0", "r7"}))
    assert sorted(two.culprits) == ["r0", "r7"]
    # launch arithmetic (1 + 2R per measurement): 0 bad is together alone; 1 bad of 8 as above plus
    # the confirmation of the 7 kept: 1 + 2 x (1 + 4 + 1) = 13, where one at a time is 1 + 2 x 8 = 17
    assert groups.launches(8, set()) == 3 and groups.launches(8, {5}) == 13
    assert groups.one_at_a_time_launches(8) == 17 and groups.launches(8, set(), repeats=2) == 5


def test_the_readme_exit_row_names_every_verdict_that_exits_1() -> None:
    # verify exits 1 on any verdict but "kept" (cli/verify.py): each must be in the README's row for 1
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| 1 |"))
    verify_part = row.split("`verify`:", 1)[1].split("`preflight`", 1)[0]
    unjudged = decide.decide("r", ["r"], PROMPTS, [], [], {"outcome": "not built", "cause": "x"})
    base = [run(100, GOOD), run(60, GOOD)]  # a scatter wider than --min-effect
    unsure = decide.decide("r", ["r"], PROMPTS, base, [run(75, GOOD), run(90, GOOD)])
    assert unjudged.verdict == "left as it was" and unsure.verdict.startswith("inconclusive")
    for words in ("rolled back", "unjudged", "inconclusive", "baseline would not serve"):
        assert words in verify_part, words
