"""Processes and devices: ranks, the launcher, logs, parallel layout, memory, FLOPs, speed settings."""
