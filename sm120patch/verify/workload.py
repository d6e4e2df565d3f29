"""The fixed workload: the shipped prompt set, and a load generator over the OpenAI-compatible API.

Each request is what SGLang's own `python -m sglang.bench_serving --backend sglang-oai` sends
(`async_request_openai_completions` in sglang/bench_serving.py, 0.5.9): POST /v1/completions with
`temperature 0`, `ignore_eos`, `max_tokens`, `stream: true`; the stream is read line by line, and
TTFT, the inter-token latencies and the latency are timed exactly where that function times them,
so the figures compare with the ones users already quote. `stream_options.include_usage` asks
for the last chunk SGLang 0.5.9 sends (`choices: []` and `usage`, serving_completions.py), so an
output's length is the server's own token count. A fixed number of requests runs at a
fixed concurrency (a semaphore), never an open loop: the load is bounded.

httpx is imported here only: nothing on the plan/apply path loads this module.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sm120patch.errors import UserError

COMPLETIONS = "/v1/completions"
GENERATE = "/generate"  # SGLang's native endpoint (bench_serving --backend sglang)
BACKENDS = {"sglang-oai": COMPLETIONS, "sglang": GENERATE}  # bench_serving's names for them
MODELS = "/v1/models"
HEALTH = "/health"
# seconds without a line of data from the server before a request counts as failed (a stream that
# stalls, a server that hangs after it was ready, one that sends only blank lines or SSE comments to
# keep the connection open); a slow stream that keeps coming is fine
REQUEST_TIMEOUT = 600.0
# seconds for the whole load at one concurrency: a server that streams without end (past max_tokens)
# never trips the per-request timeout; what is still in flight then is cancelled and counts as failed
LOAD_TIMEOUT = 3600.0


@dataclass(frozen=True)
class Prompt:
    id: str
    kind: str  # "short" | "long"
    text: str
    answer: str | None = None  # a known answer, checked by answers.known_answer_ok
    canary: bool = False


@dataclass
class RequestResult:
    """One request, as bench_serving's RequestFuncOutput records it (times in seconds)."""

    prompt_id: str
    success: bool = False
    text: str = ""
    error: str = ""
    ttft: float = 0.0  # first chunk with text, from the request's start
    itl: list[float] = field(default_factory=list)  # gaps between later chunks with text
    latency: float = 0.0  # the last line of the stream, from the request's start
    start_time: float = 0.0
    output_len: int = 0  # usage.completion_tokens, else max_tokens (bench_serving's fallback)
    tokens: list[str | int] | None = None  # the answer's tokens, where the stream carried them

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_id": self.prompt_id,
            "success": self.success,
            "error": self.error,
            "ttft": self.ttft,
            "latency": self.latency,
            "output_len": self.output_len,
            "chunks": len(self.itl) + (1 if self.ttft else 0),
        }


def load_prompts(path: Path | None = None) -> list[Prompt]:
    """The prompt set shipped with the package (or another in the same format)."""
    from sm120patch.catalogue.datafile import read_toml

    where = path or Path(str(resources.files("sm120patch.verify") / "prompts.toml"))
    try:
        blob = where.read_bytes()
    except OSError as e:
        raise UserError(f"{where}: cannot read the prompt set ({e.strerror}); check the path") from None
    data = read_toml(where, blob, "the prompt set")
    out = []
    for i, p in enumerate(data.get("prompt", [])):
        if not isinstance(p, dict) or not isinstance(p.get("id"), str) or not isinstance(p.get("text"), str):
            raise UserError(f"{where}: prompt[{i}] needs a string id and text; see sm120patch/verify/prompts.toml")
        out.append(Prompt(p["id"], p.get("kind", "short"), p["text"], p.get("answer"), bool(p.get("canary"))))
    if not out:
        raise UserError(f"{where}: no [[prompt]] tables; see sm120patch/verify/prompts.toml")
    return out


def payload(model: str, prompt: str, max_tokens: int, logprobs: bool = False) -> dict[str, Any]:
    """bench_serving's sglang-oai payload, greedy; usage asked for so output_len is the server's count.
    `logprobs`: also ask for the chosen token's logprob (`logprobs: 0`), so every chunk names its
    tokens (`choices[0].logprobs.tokens`, serving_completions.py in SGLang 0.5.9) and answers can
    be compared by tokens; SGLang then computes that logprob at every step, in both arms alike."""
    extra = {"logprobs": 0} if logprobs else {}
    return {
        **extra,
        "model": model,
        "prompt": prompt,
        "best_of": 1,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }


def native_payload(prompt: str, max_tokens: int) -> dict[str, Any]:
    """bench_serving's `--backend sglang` payload (async_request_sglang_generate, 0.5.9), greedy."""
    return {
        "text": prompt,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True},
        "stream": True,
        "return_logprob": False,
        "logprob_start_len": -1,
    }


async def stream_completion(
    client: Any,
    url: str,
    model: str,
    prompt: Prompt,
    max_tokens: int,
    idle: float | None = None,
    until: float | None = None,
    logprobs: bool = False,
    backend: str = "sglang-oai",
) -> RequestResult:
    """One streamed completion, timed as bench_serving's async_request_openai_completions times it
    (`backend` "sglang": SGLang's native /generate, as async_request_sglang_generate times it).
    `idle`: seconds without a data line (blank lines and `:` comments do not count) before it fails;
    `until`: the perf_counter() time by which it fails anyway (the load's deadline). Both are checked
    here, line by line, not left to a cancellation from outside (wait_for can lose one on 3.11)."""
    out = RequestResult(prompt.id, output_len=max_tokens)
    st = time.perf_counter()
    out.start_time = most_recent = st
    latency = 0.0
    native = backend == "sglang"
    body = native_payload(prompt.text, max_tokens) if native else payload(model, prompt.text, max_tokens, logprobs)
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode("utf-8", "replace")
                out.error = f"HTTP {resp.status_code}: {body[:300]}"
                return out
            lines = resp.aiter_lines()
            last_data = time.perf_counter()
            while True:
                now = time.perf_counter()
                idle_left = None if idle is None else last_data + idle - now
                load_left = None if until is None else until - now
                lefts = [x for x in (idle_left, load_left) if x is not None]
                if lefts and min(lefts) <= 0:
                    out.error = _late(idle_left, idle, until)
                    return out
                try:
                    raw = await asyncio.wait_for(anext(lines), timeout=min(lefts) if lefts else None)
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:  # TimeoutError from 3.11 on; not yet on 3.10
                    now = time.perf_counter()
                    out.error = _late(None if idle is None else last_data + idle - now, idle, until)
                    return out
                line = raw.strip()
                if not line or line.startswith(":"):
                    continue
                last_data = time.perf_counter()
                chunk = line.removeprefix("data: ")
                latency = time.perf_counter() - st
                if chunk == "[DONE]":
                    continue
                data = json.loads(chunk)
                if not isinstance(data, dict):
                    raise ValueError(f"a stream chunk that is not a JSON object: {chunk[:80]!r}")
                if native:
                    most_recent = _native_chunk(out, data, st, most_recent)
                    continue
                choices = data.get("choices") or [{}]
                text = choices[0].get("text") or ""
                if text:
                    now = time.perf_counter()
                    if out.ttft == 0.0:
                        out.ttft = now - st
                    else:
                        out.itl.append(now - most_recent)
                    most_recent = now
                    out.text += text
                toks = chunk_tokens(choices[0])
                if toks is not None:
                    out.tokens = (out.tokens or []) + toks
                usage = data.get("usage") or {}
                out.output_len = int(usage.get("completion_tokens", out.output_len))
        out.success, out.latency = True, latency
    except Exception as e:  # a refused connection, a reset, bad JSON: the request failed, the run goes on
        out.error = f"{type(e).__name__}: {e}"[:300]
    return out


def _native_chunk(out: RequestResult, data: dict[str, Any], st: float, most_recent: float) -> float:
    """One chunk of /generate's stream into `out`; returns the time of the latest chunk with text.

    As bench_serving reads it: `text` is the whole output so far and `meta_info.completion_tokens`
    the tokens so far; a chunk carrying k new tokens adds k gaps of (its gap / k) to the ITL.
    `output_ids` (tokenizer_manager.py, 0.5.9 and 0.5.23) are the whole list so far by default,
    the new ones only with --stream-output (0.5.9) or incremental streaming (0.5.23): a list as
    long as completion_tokens is the whole list, a shorter one is appended. Text is appended, not
    replaced, only where the ids were new ones and the text does not continue what came before
    (0.5.23's incremental mode; 0.5.9's --stream-output still sends the whole text)."""
    if "error" in data and not data.get("text"):
        raise ValueError(f"the server's stream reported an error: {str(data['error'])[:200]}")
    meta = data.get("meta_info") if isinstance(data.get("meta_info"), dict) else {}
    count = meta.get("completion_tokens")
    ids = data.get("output_ids")
    whole = True
    if isinstance(ids, list) and all(isinstance(t, int) for t in ids):
        whole = not isinstance(count, int) or len(ids) >= count
        out.tokens = list(ids) if whole else (out.tokens or []) + list(ids)
    text = data.get("text")
    if not isinstance(text, str) or not text:
        return most_recent
    now = time.perf_counter()
    out.text = text if whole or text.startswith(out.text) else out.text + text
    before = out.output_len if out.ttft else 0
    if isinstance(count, int):
        out.output_len = count
    if out.ttft == 0.0:
        out.ttft = now - st
    else:
        new = out.output_len - before
        if new <= 0:  # bench_serving skips such a chunk's timing, not its text
            return most_recent
        out.itl.extend([(now - most_recent) / new] * new)
    return now


def chunk_tokens(choice: Any) -> list[str | int] | None:
    """The tokens one streamed choice names (`logprobs.tokens`, OpenAI completions), or None."""
    lp = choice.get("logprobs") if isinstance(choice, dict) else None
    toks = lp.get("tokens") if isinstance(lp, dict) else None
    if isinstance(toks, list) and all(isinstance(t, str | int) for t in toks):
        return list(toks)
    return None


def _late(idle_left: float | None, idle: float | None, until: float | None) -> str:
    if idle_left is not None and idle_left <= 0:
        return f"no data from the server for {idle:g}s (--request-timeout)"
    return "the load ran past its deadline (--load-timeout)"


def client(concurrency: int, timeout: float = REQUEST_TIMEOUT) -> Any:
    """An httpx client for a loopback (or LAN) server: no proxies from the environment."""
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=30.0), limits=limits, trust_env=False)


@dataclass
class Load:
    """What one run of the workload at one concurrency gave."""

    concurrency: int
    results: list[RequestResult]
    duration: float  # from before the first request to after the last (bench_serving's dur_s)


async def _run(
    base_url: str,
    model: str,
    prompts: list[Prompt],
    concurrency: int,
    requests: int,
    out_len: int,
    timeout: float,
    deadline: float,
    logprobs: bool = False,
    backend: str = "sglang-oai",
) -> Load:
    url = base_url.rstrip("/") + BACKENDS[backend]
    gate = asyncio.Semaphore(concurrency)
    order = [prompts[i % len(prompts)] for i in range(requests)]
    async with client(concurrency, timeout) as http:
        start = time.perf_counter()
        until = start + deadline if deadline > 0 else None

        async def one(p: Prompt) -> RequestResult:
            async with gate:
                if until is not None and time.perf_counter() >= until:
                    return RequestResult(p.id, error="the load ran past its deadline (--load-timeout)")
                return await stream_completion(
                    http, url, model, p, out_len, idle=timeout, until=until, logprobs=logprobs, backend=backend
                )

        tasks = [asyncio.ensure_future(one(p)) for p in order]
        # the requests end themselves at the deadline; what is still stuck after that (a connect,
        # a response that never starts) is cancelled, as often as it takes
        _, pending = await asyncio.wait(tasks, timeout=deadline + 5.0 if deadline > 0 else None)
        while pending:
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=5.0)
        duration = time.perf_counter() - start
    results = []
    for p, t in zip(order, tasks, strict=True):
        if t.cancelled():
            results.append(
                RequestResult(p.id, error=f"the load ran past its deadline of {deadline:g}s (--load-timeout)")
            )
        else:
            results.append(t.result())
    return Load(concurrency, results, duration)


def run_load(
    base_url: str,
    model: str,
    prompts: list[Prompt],
    concurrency: int,
    requests: int,
    output_len: int,
    timeout: float = REQUEST_TIMEOUT,
    deadline: float = LOAD_TIMEOUT,
    logprobs: bool = False,
    backend: str = "sglang-oai",
) -> Load:
    """`requests` streamed requests (the prompt set, cycled) with at most `concurrency` in flight,
    all of them done or cancelled within `deadline` seconds (0: no limit); `logprobs`: see payload;
    `backend`: "sglang-oai" (/v1/completions) or "sglang" (/generate, whose chunks carry the ids)."""
    run = _run(base_url, model, prompts, concurrency, requests, output_len, timeout, deadline, logprobs, backend)
    return asyncio.run(run)


def ready(base_url: str, timeout: float = 10.0) -> str | None:
    """The model name once the server serves, else None. SGLang answers /v1/models as soon as its
    HTTP server is up, but /health says 503 until its own warm-up is done (`health_generate` in
    sglang/srt/entrypoints/http_server.py, 0.5.9: ServerStatus.Starting); a server without /health
    (404) is judged by /v1/models alone."""
    import httpx

    try:
        r = httpx.get(base_url.rstrip("/") + HEALTH, timeout=timeout, trust_env=False)
    except httpx.HTTPError:
        return None
    if r.status_code != 200 and r.status_code != 404:
        return None
    return model_name(base_url, timeout)


def model_name(base_url: str, timeout: float = 10.0) -> str | None:
    """The first model the server lists at /v1/models, or None when it does not answer (yet)."""
    import httpx

    try:
        r = httpx.get(base_url.rstrip("/") + MODELS, timeout=timeout, trust_env=False)
        if r.status_code != 200:
            return None
        data = r.json().get("data") or []
        return str(data[0]["id"]) if data else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError):
        return None


def listening(base_url: str, timeout: float = 2.0) -> str | None:
    """What accepts connections at the URL's host and port (a few words), or None when nothing
    does: any listener counts, whether or not it speaks the OpenAI API."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(base_url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError:
        return None
    what = f"{host}:{port} accepts connections"
    import httpx

    try:
        r = httpx.get(base_url.rstrip("/") + MODELS, timeout=timeout, trust_env=False)
        server = r.headers.get("server")
        what += f"; GET {MODELS} gave HTTP {r.status_code}" + (f" from {server}" if server else "")
    except httpx.HTTPError:
        pass
    return what
