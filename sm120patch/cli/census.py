"""`sm120patch census`: will these GPUs run the compiled CUDA code in this environment? No SGLang needed.

The census preflight ends with (sm120patch/census/), as a command of its own for any environment
(vLLM, plain torch, an image being built): the machine (GPU, driver, CUDA, torch), then every
distribution's verdict per GPU; `--markdown` for pasting into an upstream bug report.
"""

from __future__ import annotations

from pathlib import Path

import click

from sm120patch import cli
from sm120patch.cli.common import emit_json
from sm120patch.errors import EXIT_FAILED, EXIT_OK, UserError


@click.command("census", short_help=cli.summary("census"))
@click.option("--python", "python", metavar="EXE", help="Census this interpreter's site-packages (a venv's python).")
@click.option(
    "--site-packages",
    "site_packages",
    multiple=True,
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    metavar="DIR",
    help="Census DIR (repeatable) instead of --python's site-packages.",
)
@click.option("--arch", "arch", multiple=True, metavar="ARCH", help="Judge for this GPU (repeatable; sm_120, 12.1).")
@click.option("--no-torch", is_flag=True, help="Skip asking torch (in a subprocess) for its CUDA and arch list.")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
@click.option("--markdown", "as_markdown", is_flag=True, help="A Markdown summary for an upstream bug report.")
def census_cmd(
    python: str | None,
    site_packages: tuple[Path, ...],
    arch: tuple[str, ...],
    no_torch: bool,
    as_json: bool,
    as_markdown: bool,
) -> int:
    """Which installed distributions with compiled CUDA code (torch, NVIDIA's libraries, vLLM,
    sglang-kernel, FlashInfer's caches, ...) can run on these GPUs: the SASS, PTX and LTO IR each
    carries, per GPU ok / ok (JIT) / ok (LTO) / ? (cannot tell) / partial / SOME / NO, what you
    would see and what to install. GPUs: --arch, else the ones detected, else sm_120.

    Exit 0 when every distribution can run, 1 when one cannot (flashinfer-cubin aside: FlashInfer
    picks its cubins by GPU), 2 for bad input.

    \b
      sm120patch census --arch sm_121                       this interpreter's environment
      sm120patch census --python /opt/venv/bin/python --markdown
      sm120patch census --site-packages /usr/lib/python3/dist-packages --json
    """
    from sm120patch.census.render import render_lines, render_markdown
    from sm120patch.census.scan import census, failing, site_packages_for
    from sm120patch.probes.environment.device import archs_present, detect
    from sm120patch.probes.recipe_probe import resolve_archs

    if python and site_packages:
        raise UserError("give --python EXE or --site-packages DIR, not both")
    if as_json and as_markdown:
        raise UserError("give --json or --markdown, not both")
    archs, note = resolve_archs(arch)
    if python is not None:
        exe = Path(python)
        if not exe.exists():
            raise UserError(f"--python {python}: no such file; give the venv's bin/python")
    sites = [p.resolve() for p in site_packages] or site_packages_for(python)
    if not sites:
        raise UserError(f"--python {python}: found no site-packages (does it run?); or pass --site-packages DIR")
    machine = detect(archs if note == "--arch" else None, python=python, with_torch=not no_torch)
    gpus = archs if note == "--arch" else archs_present(machine) or archs
    report = census(sites, gpus, machine.driver)
    report["arch_source"] = note
    m = machine.to_dict()
    if as_json:
        emit_json({"machine": m, "census": report})
    elif as_markdown:
        click.echo(render_markdown(m, report))
    else:
        click.echo(_machine_lines(m, note))
        click.echo("\n".join(render_lines(report)))
    return EXIT_FAILED if failing(report) else EXIT_OK


def _machine_lines(m: dict, note: str) -> str:
    gpus = m.get("gpus") or []
    lines = [f"GPU {g['index']}: {g['name']} ({g['arch']}, from {g['source']})" for g in gpus] or ["GPU: none detected"]
    if note != "detected":
        lines.append(f"judged for: {', '.join(a for a in m.get('archs') or []) or '-'} ({note})")
    lines.append(f"driver: {m.get('driver') or '-'}")
    cuda = m.get("cuda") or {}
    lines.append(f"CUDA toolkit: {cuda.get('version') or 'not found'} {cuda.get('home') or ''}".rstrip())
    t = m.get("torch")
    if t:
        lines.append(
            f"torch: {t.get('version') or 'not importable'} (CUDA {t.get('cuda') or '-'}; "
            f"archs {' '.join(t.get('arch_list') or []) or '-'})" + (f" [{t['error']}]" if t.get("error") else "")
        )
    return "\n".join(lines)
