"""One training session: its built parts, its checkpointer, resume, clock and finish."""
