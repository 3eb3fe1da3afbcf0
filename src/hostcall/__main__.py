"""``python -m hostcall``: the ``hostcall`` command (see ``hostcall.cli``)."""

import sys

from hostcall.cli import main

if __name__ == "__main__":
  sys.exit(main())
