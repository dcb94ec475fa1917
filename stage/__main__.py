"""python -m stage: the staging command (stage/cli.py)."""

import sys

from stage import cli

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
