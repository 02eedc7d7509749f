"""Read-only views of a run shared by the command line and the Python API: what the store holds, and the
plan's inputs and table."""
