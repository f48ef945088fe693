"""``python -m services.eval``: grade predictions like the official harness (docs/eval.md)."""

import sys

from services.eval.main import main

if __name__ == "__main__":
    sys.exit(main())
