"""`python -m lazyweights ...`: the command line (see `lazyweights.tools.cli`)."""
import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
