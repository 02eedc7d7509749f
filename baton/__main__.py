"""``python -m baton``: the ``baton`` command, where the script is not on the PATH (a notebook's kernel)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
