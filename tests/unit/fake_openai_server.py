"""A fake OpenAI-compatible server for the verify and canary tests: a real process over HTTP.

    python fake_openai_server.py --port P --package PKG [--state DIR] [--serve-for S]

Its behaviour comes from bytes in the tree under test, as a real server's comes from the kernels
an opened gate routes to: PKG/srt/verify_knobs/<knob>.py each hold `VALUE = <literal>`, read once
at start. Test recipes rewrite those files. PKG/srt/verify_gates/reached*.py each define `gate()`,
which the server calls at start (the workload reaches that gate: a recipe's patched `gate()` logs
its `sm120patch: <id> taken` line); the other gate files are never called.

    delay    seconds per streamed token (the speed)
    mode     "ok" | "collapse" (after 2 tokens, "!" forever: flashinfer#4841) | "late" (the last
             quarter of each output differs: bf16-style late divergence) | "drift" (the first two
             completions as "ok", then every answer differs from its first token on)
    crash    true: print a crash signature line and exit 1 before serving
    hang     true: never bind the port (not ready)
    stall    true: ready, but every completion stops after its first token (hung after ready)
    wire     "ok" | "badjson" (chunks that are not JSON) | "blank" (blank lines and SSE comments,
             never a token) | "endless" (tokens without end, past max_tokens) | "stall" (as stall)

Answers: "Compute A + B" / "Compute A times B" get the right number, "Count from 1 to N" the count,
everything else words picked from a hash of the prompt: greedy decoding, so the same prompt gives
the same text. Endpoints: GET /health, GET /v1/models, POST /v1/completions (SSE, like SGLang:
`data: {json}` lines, a final usage chunk, `data: [DONE]`; with `logprobs` in the request, each
chunk's choice carries `logprobs.tokens`, its token); POST /generate (SGLang's native endpoint:
`text`, `output_ids` and `meta_info.completion_tokens` per chunk, whole so far, or new only with
`--native-stream ids-delta|delta`). Binds 127.0.0.1 only. With --state,
appends one line per launch (`pid knobs`) to DIR/launches, and one per request to DIR/requests.
`--knob-if delay=0.003:srt/x.py:REGEX` sets a knob from a real release's file instead (delay, mode).
Flags for what no recipe causes: `--wire W` and `--mode M` override the knobs (the server itself is
broken), `--own-words` answers the count prompt in words (a model that phrases it its own way),
`--serve-requests N` exits 0 after N completions, `--spawn-daemon` starts a child in a session of
its own (setsid, as some launchers do) that sleeps, its pid appended to DIR/daemons. The port is
bound with SO_REUSEPORT, so a test can hold it (bound, not listening) from before the launch on.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import http.server
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path

READY = "The server is fired up and ready to roll!"
CRASH_LINE = "RuntimeError: FakeKernelError: the fake tactic has no image for this GPU"
WORDS = [
    "the",
    "a",
    "model",
    "kernel",
    "graph",
    "token",
    "cache",
    "layer",
    "batch",
    "tensor",
    "memory",
    "stream",
    "warp",
    "block",
    "grid",
    "value",
]


def knob(pkg: Path, name: str, default: object) -> object:
    p = pkg / "srt" / "verify_knobs" / f"{name}.py"
    if not p.exists():
        return default
    m = re.search(r"^VALUE\s*=\s*(.+)$", p.read_text(), re.M)
    return ast.literal_eval(m.group(1)) if m else default


def answer_tokens(prompt: str, n: int) -> list[str]:
    head: list[str] = []
    if m := re.search(r"Compute (\d+) \+ (\d+)", prompt):
        head = [f" {int(m.group(1)) + int(m.group(2))}", "."]
    elif m := re.search(r"Compute (\d+) times (\d+)", prompt):
        head = [f" {int(m.group(1)) * int(m.group(2))}", "."]
    elif m := re.search(r"Count from 1 to (\d+)", prompt):
        head = [f"{i}, " for i in range(1, int(m.group(1)) + 1)]
    seed = hashlib.sha256(prompt.encode()).digest()
    filler = [" " + WORDS[seed[i % len(seed)] % len(WORDS)] for i in range(n)]
    return (head + filler)[:n]


def generate(prompt: str, n: int, mode: str) -> list[str]:
    toks = answer_tokens(prompt, n)
    if mode == "collapse":
        return toks[:2] + ["!"] * (n - 2)
    if mode == "late":
        cut = max(1, (3 * n) // 4)
        return toks[:cut] + [" different"] * (n - cut)
    return toks


def token_id(tok: str) -> int:
    """A stable id for a token's text (the fake has no vocabulary)."""
    return int.from_bytes(hashlib.sha256(tok.encode()).digest()[:3], "big")


def native_chunk(toks: list[str], i: int, stream: str) -> dict[str, object]:
    """The i-th chunk of /generate's stream, as SGLang's tokenizer manager builds it: by default
    the whole text and the whole output_ids so far; "ids-delta" (0.5.9 --stream-output) the new
    ids only, the whole text; "delta" (0.5.23 incremental streaming) the new text and ids only."""
    done = toks[: i + 1]
    ids = [token_id(t) for t in done]
    text = "".join(done)
    if stream in ("ids-delta", "delta"):
        ids = ids[-1:]
    if stream == "delta":
        text = done[-1]
    return {"text": text, "output_ids": ids, "meta_info": {"id": "fake", "completion_tokens": i + 1}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--package", type=Path, required=True)
    ap.add_argument("--state", type=Path)
    ap.add_argument("--serve-for", type=float, default=0.0, help="exit 0 this long after ready, if mode is ok")
    ap.add_argument(
        "--knob-if",
        action="append",
        default=[],
        metavar="NAME=VALUE:REL:REGEX",
        help="the knob takes VALUE when PKG/REL matches REGEX (a real release's gate, opened or not)",
    )
    ap.add_argument("--slow-stop", type=float, default=0.0, help="on SIGTERM, take this long to exit")
    ap.add_argument("--wire", default=None, help="override the wire knob")
    ap.add_argument("--mode", default=None, help="override the mode knob")
    ap.add_argument("--own-words", action="store_true", help="answer the count prompt in words")
    ap.add_argument("--serve-requests", type=int, default=0, help="exit 0 after this many completions")
    ap.add_argument("--spawn-daemon", action="store_true", help="start a setsid child that sleeps")
    ap.add_argument("--native-stream", default="whole", choices=["whole", "ids-delta", "delta"], help="/generate")
    args = ap.parse_args()
    if args.slow_stop:
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(args.slow_stop), os._exit(143)))
    pkg = args.package
    delay = float(knob(pkg, "delay", 0.01))  # type: ignore[arg-type]
    mode = str(knob(pkg, "mode", "ok"))
    wire = args.wire or str(knob(pkg, "wire", "ok"))
    for rule in args.knob_if:
        setting, rel, regex = rule.split(":", 2)
        name, value = setting.split("=", 1)
        if re.search(regex, (pkg / rel).read_text(), re.M):
            delay, mode = (float(value), mode) if name == "delay" else (delay, value)
    mode = args.mode or mode
    lock = threading.Lock()
    if args.state:
        args.state.mkdir(parents=True, exist_ok=True)
        with open(args.state / "launches", "a") as fh:
            fh.write(f"{os.getpid()} delay={delay} mode={mode}\n")
    print(f"fake server: delay={delay} mode={mode} wire={wire}", flush=True)
    gates = pkg / "srt" / "verify_gates"
    for gate in sorted(gates.glob("reached*.py")) if gates.is_dir() else []:
        import runpy

        fn = runpy.run_path(str(gate))["gate"]  # the workload reaches this gate (twice: one taken line)
        fn()
        fn()
    if args.spawn_daemon:
        import subprocess

        code = "import time\nwhile True: time.sleep(1)\n"
        kid = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.DEVNULL)
        if args.state:
            with open(args.state / "daemons", "a") as fh:
                fh.write(f"{kid.pid}\n")
    if knob(pkg, "crash", False):
        print("Traceback (most recent call last):", flush=True)
        print(CRASH_LINE, flush=True)
        sys.exit(1)
    if knob(pkg, "hang", False):
        print("loading weights ...", flush=True)
        time.sleep(300)
        sys.exit(1)

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *a: object) -> None:
            pass

        def _json(self, code: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":  # 503 while "starting", as SGLang says until its warm-up is done
                self._json(503 if time.monotonic() < up_at else 200, {})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            native = self.path == "/generate"
            if self.path != "/v1/completions" and not native:
                self._json(404, {"error": "not found"})
                return
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            if native:  # SGLang's GenerateReqInput: text, sampling_params.max_new_tokens
                sp = req.get("sampling_params", {})
                req = {"prompt": req.get("text", ""), "max_tokens": sp.get("max_new_tokens")}
            n = int(req.get("max_tokens") or 16)
            stall = bool(knob(pkg, "stall", False)) or wire == "stall"
            prompt = str(req.get("prompt", ""))
            with lock:
                started[0] += 1
                nth = started[0]
            toks = generate(prompt, n, mode)
            if mode == "drift" and nth > 2:
                toks = [" drifted"] + generate(prompt + " drift", n, "ok")[: n - 1]
            if args.own_words and "Count from 1 to" in prompt:
                toks = [" Sure!", " Here", " is", " the", " count:", " one,", " two,", " three", " and", " so", " on."]
                toks = (toks + [" done"] * n)[:n]
            if args.state:
                early = " early" if time.monotonic() < up_at else ""  # sent before /health said so
                with lock, open(args.state / "requests", "a") as fh:
                    fh.write(f"{os.getpid()} {n}{early}\n")
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                if wire == "blank":
                    while True:  # keeps the connection busy, never a token
                        time.sleep(0.05)
                        self.wfile.write(b"\n: keep-alive\n\n")
                        self.wfile.flush()
                i = 0
                while i < len(toks) or wire == "endless":
                    tok = toks[i % len(toks)]
                    time.sleep(delay if not (stall and i == 1) else 60)
                    chunk: dict[str, object] = {"choices": [{"index": 0, "text": tok, "finish_reason": None}]}
                    if native:
                        chunk = native_chunk(toks, i, args.native_stream)
                    elif req.get("logprobs") is not None:  # SGLang's to_openai_style_logprobs shape
                        lp = {"tokens": [tok], "token_logprobs": [0.0], "top_logprobs": [], "text_offset": [-1]}
                        chunk["choices"][0]["logprobs"] = lp
                    line = "{not json" if wire == "badjson" else json.dumps(chunk)
                    self.wfile.write(f"data: {line}\n\n".encode())
                    self.wfile.flush()
                    i += 1
                usage = {"choices": [], "usage": {"completion_tokens": len(toks)}}
                last = "" if native else f"data: {json.dumps(usage)}\n\n"  # /generate: no usage chunk
                self.wfile.write(f"{last}data: [DONE]\n\n".encode())
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass
            if args.serve_requests:
                with lock:
                    served[0] += 1
                    if served[0] == args.serve_requests:
                        threading.Thread(target=httpd.shutdown).start()

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256  # a burst of connects must not wait on SYN retries

        def server_bind(self) -> None:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # the test holds the port
            super().server_bind()

    served, started = [0], [0]
    httpd = Server(("127.0.0.1", args.port), Handler)
    up_at = time.monotonic() + 0.2  # /health answers 200 from then on
    print(READY, flush=True)
    if args.serve_for and mode == "ok":
        threading.Timer(args.serve_for, httpd.shutdown).start()
    httpd.serve_forever()


if __name__ == "__main__":
    main()
