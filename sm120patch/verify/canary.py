"""`guard --canary`: a greedy prompt sent to the running server at an interval, its answer
compared with the server's own first answer.

flashinfer#4841 leaves the server healthy while 4-19 % of long generations collapse to `!!!!`;
nothing in its log says so. The canary sends the prompt set's `canary = true` prompt (count from
1 to 30) with greedy decoding. What it expects is not a fixed string: a reasoning model, another
chat template or a small quantized model answers that prompt in its own words, and a canary that
wanted '1, 2, 3' took healthy servers down. The reference is the server's own first valid answer
(kept across guard's relaunches); the canary reports a collapse (answers.collapse: a repeated
unit, an empty output), in the reference too, and a change from the reference beyond the bf16
tolerance verify uses (answers.compare: a divergence before half the text). Either is an event on
guard's queue; guard then stops the server, rolls back the recipes that can change outputs,
relaunches. When the bad output outlives every rollback, the recipes were not the cause: guard
puts them back (engine/reapply.py), relaunches and keeps the server running, the canary then watching
only (`acting = False`: it reports, guard changes nothing). A request that fails (the server
busy, restarting) is reported once, never acted on: crashes are guard's other job.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

from sm120patch.verify import answers, workload

DEFAULT_TOKENS = 256


class Canary:
    """One thread per launch, started when the server is ready, stopped when guard stops watching."""

    def __init__(self, base_url: str, interval: float, tokens: int = DEFAULT_TOKENS, model: str | None = None):
        self.base_url, self.interval, self.tokens, self.model = base_url.rstrip("/"), interval, tokens, model
        prompts = [p for p in workload.load_prompts() if p.canary]
        self.prompt = prompts[0]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.checks = 0
        self.reference: str | None = None  # the server's own first valid answer
        self.acting = True  # False: report bad output, guard does nothing about it

    def start(self, events: queue.Queue[tuple[str, object]]) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(events,), name="guard-canary", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def watch_only(self) -> None:
        """From now on: a new reference (the next answer), and reports only."""
        self.acting = False
        self.reference = None

    def judge(self, text: str) -> tuple[str, str]:
        """("ok" | "bad", why) for one answer, against the reference (recorded from the first)."""
        why = answers.collapse(text)
        if why:
            return "bad", f"collapse: {why}"
        if self.reference is None:
            self.reference = text
            return "ok", f"reference recorded: {text[:80]!r}"
        cmp = answers.compare(self.reference, text)
        if not cmp["agree"]:
            return "bad", (
                f"answer changed from the server's own first answer at character {cmp['first_divergence']}: "
                f"{self.reference[:60]!r} -> {text[:60]!r}"
            )
        return "ok", text[:80]

    def check(self) -> tuple[str, str]:
        """("ok" | "bad" | "error", what was seen) for one greedy request."""
        model = self.model or workload.model_name(self.base_url) or "default"
        url = self.base_url + workload.COMPLETIONS
        idle = max(60.0, self.interval * 4)

        async def one() -> workload.RequestResult:
            async with workload.client(1, timeout=idle) as http:
                return await workload.stream_completion(http, url, model, self.prompt, self.tokens, idle=idle)

        r = asyncio.run(one())
        if not r.success:
            return "error", r.error
        return self.judge(r.text)

    def _loop(self, events: queue.Queue[tuple[str, Any]]) -> None:
        errors, said_ok, said_bad = 0, False, False
        while not self._stop.is_set():
            try:
                kind, seen = self.check()
            except Exception as e:  # the canary must never take guard down
                kind, seen = "error", f"{type(e).__name__}: {e}"
            self.checks += 1
            if kind == "bad":
                if self.acting:
                    events.put(("canary-bad", seen))
                    return
                if not said_bad:
                    said_bad = True
                    events.put(("canary-seen", seen))
            if kind == "ok" and not said_ok:
                said_ok = True
                events.put(("canary-ok", seen))
            if kind == "error":
                errors += 1
                if errors == 1:
                    events.put(("canary-error", seen))
            self._stop.wait(self.interval)
