"""``python -m services.swerl_cli``: the same as the ``swerl`` console script."""

import sys

from services.swerl_cli.main import main

if __name__ == "__main__":
    sys.exit(main())
