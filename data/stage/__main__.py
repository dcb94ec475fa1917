"""python -m data.stage: the staging command (data/stage/cli.py)."""

import sys

from data.stage import cli

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
