"""Crash triage: what a server log says went wrong, and what to do next (`diagnose`, and the
log reading `guard` relies on; docs/crashed.md).

`log_input` refuses what is not a text log; `prefilter` keeps only the lines any signature or
cue could match (one combined regex, streaming); `fatal` finds the fatal lines and strips log
prefixes; `logkind` tells the framework and the GPU a log comes from; `signatures` loads the
catalogue (patches/signatures.toml); `diagnose` matches recipes' and catalogue signatures and,
where none matches, answers from the log's structure (`structure`, with the cause classes and
cues in `classes`); `fixes` turns a finding into the sm120patch command for the user's tree.
"""
