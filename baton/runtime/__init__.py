"""Processes and devices: ranks, the launcher, logs, parallel layout, memory, FLOPs, speed settings, the attention
refusal, deterministic kernels and the fused cross-entropy."""
