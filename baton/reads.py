"""Reading a person's files through third-party libraries (gzip, pyarrow, json, tomllib, safetensors,
tokenizers, transformers): whatever a library raises for a damaged or wrong file becomes one line naming
the file, what was wrong and the fix, instead of the library's traceback.

Only the read itself is wrapped: an exception from baton's own code around it is still a bug and is
reported as one (cli: exit 1, traceback in the log).
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import BatonError, DataError

# What every reader may raise for a file that is damaged, cut short, of another format or unreadable.
BASE_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, ValueError, zlib.error, UnicodeError)


def _library_errors() -> tuple[type[BaseException], ...]:
    """The error types of the readers already imported (importing one here would cost seconds)."""
    out: list[type[BaseException]] = []
    if "safetensors" in sys.modules:
        from safetensors import SafetensorError

        out.append(SafetensorError)
    if "pyarrow" in sys.modules:
        import pyarrow

        out.append(pyarrow.ArrowException)
    return tuple(out)


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception as a short single line: libraries put whole reports into their messages."""
    text = " ".join(str(e).split()) or type(e).__name__
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


@contextmanager
def reading(path: str | Path, what: str, fix: str, also: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Run a third-party read of ``path`` (``what`` it should be); its failure becomes a DataError:
    ``<what> <path> could not be read (<cause>); <fix>``. ``also``: further types this reader raises for
    bad input (tokenizers raises a bare Exception; a JSON of the wrong shape raises KeyError/TypeError)."""
    try:
        yield
    except BatonError:
        raise
    except (*BASE_ERRORS, *_library_errors(), *also) as e:
        raise DataError(f"{what} {path} could not be read ({one_line(e)}); {fix}") from None
