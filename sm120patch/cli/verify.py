"""`sm120patch verify`: an A/B of recipes on the user's own server, keeping only what pays.

The click layer only: parsing, choosing the candidates, printing. The work is in
sm120patch/verify/ (imported when the command runs, so `--help` does not load httpx).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from sm120patch import cli
from sm120patch.cli import common
from sm120patch.cli.common import emit_json
from sm120patch.cli.options import TreeOptions, tree_options
from sm120patch.errors import EXIT_FAILED, EXIT_OK, UserError


class _ServerAfterDashes(click.Command):
    """PATH... before `--`, the server command after it (two lists click cannot tell apart)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            i = args.index("--")
            ctx.meta["server_command"] = args[i + 1 :]
            args = args[:i]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "-- SERVER COMMAND..."]


@click.command("verify", cls=_ServerAfterDashes, short_help=cli.summary("verify"))
@tree_options("spec")
@click.option(
    "--recipe", "only", multiple=True, metavar="ID", help="Recipe to verify (repeatable). Default: the applied ones."
)
@click.option("--one-at-a-time", is_flag=True, help="Judge each recipe on its own (A B1 A B2 A ...), not all together.")
@click.option(
    "--concurrency",
    "concurrencies",
    multiple=True,
    type=click.IntRange(1, 65536),
    metavar="N",
    help="Requests in flight (repeatable). Default: 8 and 32.",
)
@click.option(
    "--output-len", type=click.IntRange(1, 1 << 20), default=256, show_default=True, help="Tokens per request."
)
@click.option(
    "--requests",
    type=click.IntRange(1, 1 << 20),
    default=None,
    help="Requests per concurrency [default: max(N, prompts)].",
)
@click.option(
    "--repeats", type=click.IntRange(1, 100), default=1, show_default=True, help="Rounds of the interleaving."
)
@click.option(
    "--ready-timeout",
    type=float,
    default=1800.0,
    show_default=True,
    metavar="S",
    help="Seconds to become ready (0: no limit).",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0.1),
    default=600.0,
    show_default=True,
    metavar="S",
    help="Seconds without a line of data from the server before a request fails (a server hung after it was "
    "ready, or one that sends only blank lines).",
)
@click.option(
    "--load-timeout",
    type=click.FloatRange(min=0.0),
    default=3600.0,
    show_default=True,
    metavar="S",
    help="Seconds for the whole load at one concurrency; what is still in flight then fails (0: no limit).",
)
@click.option(
    "--noise-floor",
    type=click.FloatRange(0.0, 1.0),
    default=0.02,
    show_default=True,
    metavar="FRACTION",
    help="The smallest slowdown that counts, even when runs agree more closely (0.05: 5 %).",
)
@click.option(
    "--min-effect",
    type=click.FloatRange(0.0, 1.0),
    default=0.05,
    show_default=True,
    metavar="FRACTION",
    help="The smallest slowdown you care about: noise wider than this that could hide one is 'inconclusive'.",
)
@click.option(
    "--if-inconclusive",
    type=click.Choice(["keep", "rollback"]),
    default="keep",
    show_default=True,
    help="What an inconclusive candidate gets.",
)
@click.option(
    "--logprobs",
    is_flag=True,
    help="Ask for each token (OpenAI logprobs: 0) and compare answers by tokens, not characters "
    "(the server then computes one logprob a step, in both arms).",
)
@click.option(
    "--backend",
    type=click.Choice(["sglang-oai", "sglang"]),
    default="sglang-oai",
    show_default=True,
    help="The load, as bench_serving's --backend: sglang-oai (/v1/completions) or sglang (SGLang's native "
    "/generate, whose output ids let answers be compared by tokens at no extra cost).",
)
@click.option("--url", default="http://127.0.0.1:30000", show_default=True, help="Where the command serves.")
@click.option("--model", default=None, help="Model name for the API [default: the first of /v1/models].")
@click.option(
    "--warmup",
    type=click.IntRange(0, 1 << 16),
    default=None,
    help="Warm-up requests per launch [default: one per prompt].",
)
@click.option("--grace", type=float, default=10.0, show_default=True, help="Seconds between SIGTERM and SIGKILL.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Report and server logs [default: ./sm120patch-verify-TIME].",
)
def verify_cmd(opts: TreeOptions, **kw: Any) -> int:
    """Launch your server with and without the recipes, drive a fixed greedy workload through its
    OpenAI API, and keep each recipe only where it is not slower beyond the measured noise and its
    answers agree; roll back the rest through the journal.

    \b
    Example (docs/verify.md):
      sm120patch verify ~/src/sglang --one-at-a-time --concurrency 64 -- \\
          python -m sglang.launch_server --model-path ... --port 30000

    Baseline and candidate launches interleave (A B A ...), so drift shows up as measured noise.
    A recipe is measured with what it stands on (a gate with its FlashInfer backport). Without
    --one-at-a-time all are judged together first; if that breaks the rule, the culprits are
    found by halving the set, and the kept set is confirmed together.
    Figures are SGLang bench_serving's (output tok/s, TTFT, TPOT, ITL). The tree ends in a known
    state: the kept recipes; or, after Ctrl-C or a baseline that will not start, as it began.
    Results go to --out (report.json, report.md, throughput.png with the `plot` extra, server
    logs) and beside the journal, where `sm120patch status` shows them.

    Exit 0: every candidate kept on a conclusive measurement; 1: one was rolled back, left
    unjudged or inconclusive, or the baseline would not serve; 2: bad usage, or something already
    listens at --url; 130: interrupted (the tree put back).
    """
    command = click.get_current_context().meta.get("server_command") or []
    if not command:
        raise UserError(
            "verify: no server command; give it after --, e.g. verify PATH -- python -m sglang.launch_server ..."
        )
    return run_verify(command, opts, **kw)


def run_verify(
    command: list[str],
    opts: TreeOptions,
    *,
    only: tuple[str, ...],
    concurrencies: tuple[int, ...],
    url: str,
    out_dir: Path | None,
    **workload: Any,
) -> int:
    """The A/B itself; `workload` is the rest of verify's options, named as `verify.runner.Options` names them."""
    from sm120patch.engine.pipeline import RunSettings
    from sm120patch.planning.targets import targets_for
    from sm120patch.probes.recipe_probe import resolve_archs
    from sm120patch.triage.signatures import load_signatures
    from sm120patch.verify import record, report
    from sm120patch.verify.runner import BaselineFailed, Options, Runner
    from sm120patch.verify.tree import Tree

    if workload.get("logprobs") and workload.get("backend") == "sglang":
        raise UserError(
            "--logprobs asks /v1/completions for the tokens; --backend sglang has them already: leave one out"
        )
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--url: {url!r} is not an http(s) URL; e.g. http://127.0.0.1:30000")
    recipes = common.load_recipes(opts.recipe_dir)
    signatures = load_signatures(opts.recipe_dir / "signatures.toml" if opts.recipe_dir else None)
    known = {r.id: r for r in recipes}
    common.check_ids(recipes, "--recipe", only)
    targets = targets_for(opts.paths, opts.installed, opts.package)
    archs, _ = resolve_archs(opts.arch)
    run = RunSettings.probing(targets, archs, opts.level, opts.flashinfer, opts.python)
    candidates = list(dict.fromkeys(only))
    if not candidates:
        from sm120patch.engine.tree import applied_recipes

        candidates = sorted({i for t in targets for i in applied_recipes(t.root)})
    if not candidates:
        raise UserError(f"{targets[0].root}: nothing to verify; apply recipes first, or name them with --recipe ID")
    out = out_dir or Path(f"sm120patch-verify-{time.strftime('%Y%m%d-%H%M%S')}")
    ab = Options(
        command=list(command),
        candidates=candidates,
        base_url=url,
        concurrencies=list(dict.fromkeys(concurrencies)) or [8, 32],
        out_dir=out,
        **workload,
    )
    tree = Tree(targets, recipes, run, candidates)
    try:
        result = Runner(ab, tree, recipes, signatures=signatures).run()
    except BaselineFailed as e:
        click.echo(f"sm120patch: verify: {e}; the tree is as it was, nothing decided", err=True)
        return EXIT_FAILED
    paths_written = report.write(result, out)
    result["report"] = paths_written
    for t in targets:
        mine = [d for d in result["decisions"] if any(known[r].package == t.package for r in d["recipes"])]
        if mine:
            record.write(t.root, mine, paths_written["markdown"])
    if opts.as_json:
        emit_json(result)
    else:
        for line in report.lines(result):
            click.echo(line)
        click.echo(f"now applied: {', '.join(result['final']) or 'nothing'}")
        click.echo(
            f"report: {paths_written['markdown']}"
            + ("" if "plot" in paths_written else " (no plot: pip install 'sm120patch[plot]')")
        )
    from sm120patch.verify.decide import PASSING

    return EXIT_OK if all(d["verdict"] in PASSING for d in result["decisions"]) else EXIT_FAILED
