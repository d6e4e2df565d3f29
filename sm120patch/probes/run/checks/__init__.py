"""Run-rung check scripts. Never import these in the tool: they import torch and FlashInfer.

Each file here is executed by `harness.py` under the *target* interpreter (the server's
Python), in a child process that sm120patch.probes.run.ranks started; the tool only reads
the JSON lines they print. They are a package only so that the wheel carries them.
"""
