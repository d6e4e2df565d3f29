"""Do the candidate's greedy outputs still agree with the baseline's?

Per prompt: the length of the common prefix, where the two first diverge, exact match, whether a
known answer is still there, and collapse. Where both runs carry the answer's tokens (the
OpenAI-compatible `logprobs.tokens` of each streamed chunk, one per position, with `verify
--logprobs`; the `output_ids` of SGLang's native /generate), the prefix, the first divergent token
and the agreement ratio (common token prefix over the baseline's tokens) are by tokens: that is
what greedy decoding decides, one position at a time. Otherwise by characters, which bound the
token prefix from below; every row and every summary says which (`by`). Collapse and known
answers are read in the text either way.

The tolerance, and why it separates the two cases the issue names:

- bf16 kernels that sum in another order (a fused all-reduce, another GEMM) change low-order bits;
  under greedy decoding that flips a token only where two candidates nearly tie, which is rare,
  so the outputs share a long prefix and the text after the divergence is still fluent. Such a
  late divergence (at or after LATE_FRACTION of the baseline's text) counts as agreement.
- flashinfer#4841 (autotuned CUTLASS fused-MoE tactics on SM12x under CUDA graphs): the generation
  collapses into one repeated character, `!!!!`, anywhere in it. A collapse the baseline does not
  show for the same prompt is a disagreement wherever it starts; so is an empty output, and so is
  a divergence before LATE_FRACTION.

Collapse means a unit of 1 to 4 characters (starting with a non-space) repeated at least
COLLAPSE_REPEATS times in a row: 16 `!` in a row, or `ab ` 16 times. A long greedy loop of a whole
sentence is not a collapse (small models do it in the baseline too). At the level of a whole run,
decide.py asks for no new collapse, no lost known answer, and an agreement rate no lower than
AGREE_MIN or the baseline's own rate against itself across its launches, whichever is lower.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sm120patch.verify.workload import Prompt

LATE_FRACTION = 0.5  # a divergence at or after half the baseline's text is late (bf16 noise)
COLLAPSE_REPEATS = 16
ANSWER_WINDOW = 200  # characters of the output a known answer must appear in
AGREE_MIN = 0.9

_COLLAPSE = re.compile(r"(\S.{0,3}?)\1{" + str(COLLAPSE_REPEATS - 1) + ",}", re.DOTALL)


def collapse(text: str) -> str | None:
    """Why `text` is a collapsed generation ("empty", or the repeated unit and where), else None."""
    if not text.strip():
        return "empty output"
    m = _COLLAPSE.search(text)
    if m is None:
        return None
    return f"{m.group(1)!r} repeated {len(m.group(0)) // len(m.group(1))}x from character {m.start()}"


def known_answer_ok(prompt: Prompt, text: str) -> bool | None:
    """True/False for a prompt with a known answer (a whole word in the first ANSWER_WINDOW
    characters), None for a prompt without one."""
    if not prompt.answer:
        return None
    return re.search(r"(?<!\w)" + re.escape(prompt.answer) + r"(?!\w)", text[:ANSWER_WINDOW]) is not None


Token = str | int  # a token's text (OpenAI logprobs) or its id (SGLang's output_ids)


def _common(a: Sequence[Token], b: Sequence[Token]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def compare(
    base: str, cand: str, base_tokens: Sequence[Token] | None = None, cand_tokens: Sequence[Token] | None = None
) -> dict[str, Any]:
    """One prompt's baseline and candidate outputs, by the tolerance above: by tokens when both
    token lists are given, by characters otherwise."""
    prefix = len(os.path.commonprefix([base, cand]))
    new_collapse = collapse(cand) if collapse(base) is None else None
    row: dict[str, Any] = {"prefix_chars": prefix, "collapse": new_collapse}
    if base_tokens is not None and cand_tokens is not None:
        common = _common(base_tokens, cand_tokens)
        exact = list(base_tokens) == list(cand_tokens)
        fraction = common / len(base_tokens) if base_tokens else (1.0 if exact else 0.0)
        row.update(by="tokens", prefix_tokens=common, first_divergent_token=None if exact else common)
        row["token_agreement"] = fraction
    else:
        exact = base == cand
        fraction = prefix / len(base) if base else (1.0 if exact else 0.0)
        row["by"] = "characters"
    late = fraction >= LATE_FRACTION
    row.update(exact=exact, prefix_fraction=fraction, first_divergence=None if base == cand else prefix)
    row["agree"] = exact or (late and new_collapse is None)
    return row


def _by(rows: Sequence[Mapping[str, Any]]) -> str:
    """How a set was compared: "tokens", "characters", or "mixed" (tokens for some prompts only)."""
    kinds = {r["by"] for r in rows}
    return kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "characters")


def compare_sets(
    prompts: Sequence[Prompt],
    base: Mapping[str, str],
    cand: Mapping[str, str],
    base_tokens: Mapping[str, Sequence[Token]] | None = None,
    cand_tokens: Mapping[str, Sequence[Token]] | None = None,
) -> dict[str, Any]:
    """Every prompt both runs answered: counts, known-answer accuracy of each, collapses, divergences;
    by tokens for a prompt whose tokens both runs carry."""
    rows = []
    bt, ct = base_tokens or {}, cand_tokens or {}
    for p in prompts:
        if p.id not in base or p.id not in cand:
            continue
        row = {"prompt": p.id, **compare(base[p.id], cand[p.id], bt.get(p.id), ct.get(p.id))}
        row["answer_base"], row["answer_cand"] = known_answer_ok(p, base[p.id]), known_answer_ok(p, cand[p.id])
        rows.append(row)
    known = [r for r in rows if r["answer_base"] is not None]
    return {
        "by": _by(rows),
        "by_tokens": sum(r["by"] == "tokens" for r in rows),
        "compared": len(rows),
        "agree": sum(r["agree"] for r in rows),
        "exact": sum(r["exact"] for r in rows),
        "collapses": [{"prompt": r["prompt"], "why": r["collapse"]} for r in rows if r["collapse"]],
        "known": len(known),
        "correct_base": sum(bool(r["answer_base"]) for r in known),
        "correct_cand": sum(bool(r["answer_cand"]) for r in known),
        "divergences": [_divergence(r) for r in rows if not r["exact"]],
    }


def _divergence(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {"prompt": row["prompt"], "by": row["by"], "at_char": row["first_divergence"]}
    if row["by"] == "tokens":
        out["at_token"] = row["first_divergent_token"]
        out["token_agreement"] = round(row["token_agreement"], 3)
    out["prefix_fraction"] = round(row["prefix_fraction"], 3)
    return out
