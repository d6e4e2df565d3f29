"""`sm120patch verify` and `guard --canary`: does an opened gate pay on this server, and are its
answers still right?

One job per module: workload (prompt set, load generator), metrics (bench_serving's figures),
answers (agreement, collapse), schedule (A-B-A interleaving, noise), decide (the keep rule),
report (JSON, Markdown, plot), tree (switching through the journal), runner (launches, the
tree's end state), record (verify.json beside the journal), canary (guard's watch on the server's answers).
Only workload and canary import httpx; nothing here is on the plan/apply path.
"""
