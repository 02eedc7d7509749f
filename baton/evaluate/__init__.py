"""Evaluating a checkpoint: held-out loss and bits per byte, text files, lm-eval tasks, the eval record."""
