"""Census of an environment's compiled CUDA code: can these GPUs run it, and if not, what to
install (`preflight`'s census section; docs/census.md).

One module per job: `scan` finds each distribution's shared objects and cubins and reads their
fatbin headers (through `sm120patch.probes.environment.elf`), with a per-file cache; `rules` is the loader's
compatibility rules, each citing the CUDA documentation; `verdicts` judges each module per GPU;
`fixes` says what to install or rebuild; `ptxas` finds the ptxas Triton would use; `render`
writes the text. Only the functions below are for the rest of sm120patch.
"""

from sm120patch.census.scan import census, for_preflight, record_files, site_packages_for, site_packages_of, sites_for

__all__ = ["census", "for_preflight", "record_files", "site_packages_for", "site_packages_of", "sites_for"]
