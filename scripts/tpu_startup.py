"""What the TPU start-up (tpu_utils/tpu/startup.py) decides on this host, or for an accelerator type, as `export` lines
for a shell:

  python -m scripts.tpu_startup                               # this host
  python -m scripts.tpu_startup --accelerator_type=v6e-8      # a slice you are about to create
"""

import argparse
import os
import shlex
import sys

from tpu_utils.tpu.facts import gather_facts
from tpu_utils.tpu.startup import decide


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accelerator_type", help="decide for this accelerator type instead of this host's")
    args = parser.parse_args(argv)
    environ = dict(os.environ)
    if args.accelerator_type:
        environ["TPU_ACCELERATOR_TYPE"] = args.accelerator_type
    decision = decide(gather_facts(environ))
    print(decision.summary(), file=sys.stderr)
    for key, value in decision.env.items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
