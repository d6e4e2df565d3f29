"""`guard --canary`: a known-answer greedy prompt sent to the running server at an interval.

flashinfer#4841 leaves the server healthy while 4-19 % of long generations collapse to `!!!!`;
nothing in its log says so. The canary asks for a fully determined output (the prompt set's
`canary = true` prompt: count from 1 to 30) with greedy decoding, and reports a collapse
(answers.collapse) or a lost known answer (answers.known_answer_ok) as an event on guard's
queue; guard then stops the server, rolls back the recipes that can change outputs, relaunches.
A request that fails (the server busy, restarting) is reported once, never acted on: crashes
are guard's other job.
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

    def start(self, events: queue.Queue[tuple[str, object]]) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(events,), name="guard-canary", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def check(self) -> tuple[str, str]:
        """("ok" | "bad" | "error", what was seen) for one greedy request."""
        model = self.model or workload.model_name(self.base_url) or "default"
        url = self.base_url + workload.COMPLETIONS

        async def one() -> workload.RequestResult:
            async with workload.client(1, timeout=max(60.0, self.interval * 4)) as http:
                return await workload.stream_completion(http, url, model, self.prompt, self.tokens)

        r = asyncio.run(one())
        if not r.success:
            return "error", r.error
        why = answers.collapse(r.text)
        if why:
            return "bad", f"collapse: {why}"
        if answers.known_answer_ok(self.prompt, r.text) is False:
            return "bad", f"answer changed: expected {self.prompt.answer!r} in {r.text[:80]!r}"
        return "ok", r.text[:80]

    def _loop(self, events: queue.Queue[tuple[str, Any]]) -> None:
        errors, said_ok = 0, False
        while not self._stop.is_set():
            try:
                kind, seen = self.check()
            except Exception as e:  # the canary must never take guard down
                kind, seen = "error", f"{type(e).__name__}: {e}"
            self.checks += 1
            if kind == "bad":
                events.put(("canary-bad", seen))
                return
            if kind == "ok" and not said_ok:
                said_ok = True
                events.put(("canary-ok", seen))
            if kind == "error":
                errors += 1
                if errors == 1:
                    events.put(("canary-error", seen))
            self._stop.wait(self.interval)
