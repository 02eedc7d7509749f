"""Errors that reach the user as one clear line (exit status 2), never as a traceback."""


class BatonError(Exception):
    """A problem the user can fix: bad config, bad flag, bad or missing input."""

    def _render_traceback_(self) -> list[str]:
        # IPython (a notebook cell) shows these lines instead of the traceback: the one line the CLI prints.
        return [f"baton: error: {self}"]


class ConfigError(BatonError):
    """The configuration is invalid; the message lists every problem at once."""


class DataError(BatonError):
    """A shard, manifest or tokenizer is missing, corrupt or inconsistent."""


class StoreError(BatonError):
    """The store could not be reached, refused us, or holds something unexpected."""


class VerificationError(StoreError):
    """The store does not provably hold the exact bytes we pushed."""


class ResumeError(BatonError):
    """A checkpoint exists but cannot be resumed from; never a reason to start at step 0."""


class LocalDiskError(BatonError):
    """This machine's disk refused a write (full, read-only, no permission): the store is not at fault."""


class WriteConflict(StoreError):
    """A conditional write lost: the object was not at the version the writer named (another writer moved it)."""


class LeaseHeld(BatonError):
    """Another live session holds the run's lease: this one must not write anything to the run."""


class Fenced(StoreError):
    """This session's lease was taken over (or lapsed): it must stop at once and write nothing more."""
