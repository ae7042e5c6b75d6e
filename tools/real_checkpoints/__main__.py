"""``python tools/real_checkpoints ...`` (or ``python -m real_checkpoints``)."""

from __future__ import annotations

import sys
from pathlib import Path

if __package__:
    from .cli import main
else:
    # Run as a directory: put tools/ on sys.path instead of this package's
    # own directory, and import the package properly.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    sys.path.insert(0, str(_here.parent))
    from real_checkpoints.cli import main

if __name__ == "__main__":
    sys.exit(main())
