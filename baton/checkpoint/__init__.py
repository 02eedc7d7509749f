"""Checkpoints: their contents (state), the verified push cycle (cycle) and finding them again (resume)."""
