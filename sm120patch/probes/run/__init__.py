"""The run rung: kernel checks executed on the GPUs under the target interpreter, and what their numbers mean."""
