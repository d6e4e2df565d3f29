"""sm120patch: open SGLang/FlashInfer fast paths on SM120/SM121 GPUs, safely and reversibly."""

__version__ = "0.1.0"
