"""``python tools/tiny_checkpoint ...`` (or ``python -m tiny_checkpoint``)."""

from __future__ import annotations

import sys
from pathlib import Path

if __package__:
    from .cli import main
else:
    # Run as a directory: Python put this package's own directory on
    # sys.path (so its modules would be importable as top-level names);
    # put tools/ there instead and import the package properly.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    sys.path.insert(0, str(_here.parent))
    from tiny_checkpoint.cli import main

if __name__ == "__main__":
    sys.exit(main())
