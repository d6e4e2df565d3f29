"""Do the candidate's greedy outputs still agree with the baseline's?

Per prompt: the length of the common prefix, where the two first diverge, exact match, whether a
known answer is still there, and collapse. Text is compared by characters: the API gives no token
ids, and a character prefix bounds the token prefix from below.

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


def compare(base: str, cand: str) -> dict[str, Any]:
    """One prompt's baseline and candidate outputs, by the tolerance above."""
    prefix = len(os.path.commonprefix([base, cand]))
    exact = base == cand
    new_collapse = collapse(cand) if collapse(base) is None else None
    late = prefix >= LATE_FRACTION * len(base)
    return {
        "exact": exact,
        "prefix_chars": prefix,
        "prefix_fraction": prefix / len(base) if base else (1.0 if exact else 0.0),
        "first_divergence": None if exact else prefix,
        "collapse": new_collapse,
        "agree": exact or (late and new_collapse is None),
    }


def compare_sets(prompts: Sequence[Prompt], base: Mapping[str, str], cand: Mapping[str, str]) -> dict[str, Any]:
    """Every prompt both runs answered: counts, known-answer accuracy of each, collapses, divergences."""
    rows = []
    for p in prompts:
        if p.id not in base or p.id not in cand:
            continue
        row = {"prompt": p.id, **compare(base[p.id], cand[p.id])}
        row["answer_base"], row["answer_cand"] = known_answer_ok(p, base[p.id]), known_answer_ok(p, cand[p.id])
        rows.append(row)
    known = [r for r in rows if r["answer_base"] is not None]
    return {
        "compared": len(rows),
        "agree": sum(r["agree"] for r in rows),
        "exact": sum(r["exact"] for r in rows),
        "collapses": [{"prompt": r["prompt"], "why": r["collapse"]} for r in rows if r["collapse"]],
        "known": len(known),
        "correct_base": sum(bool(r["answer_base"]) for r in known),
        "correct_cand": sum(bool(r["answer_cand"]) for r in known),
        "divergences": [
            {"prompt": r["prompt"], "at_char": r["first_divergence"], "prefix_fraction": round(r["prefix_fraction"], 3)}
            for r in rows
            if not r["exact"]
        ],
    }
