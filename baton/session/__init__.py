"""One training session: its built parts, train state, checkpointer, resume and what it may change (drift),
clock and finish; the loss-spike detector and the rollback it may ask for."""
