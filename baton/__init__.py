"""baton: pretrain small Llama-style models across interruptible GPU sessions without losing a step."""

__version__ = "0.1.0"
