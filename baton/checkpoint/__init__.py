"""Checkpoints: their contents (state), the verified push cycle (cycle), the background push (pusher), reading
the pointer and pulling (pull), and finding any verified step (select)."""
