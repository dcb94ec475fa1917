"""Runs a notebook's code cells top to bottom in this process, like a kernel would: `python tests/run_notebook.py NB`.

No Jupyter needed: the template's notebooks are plain Python (no ! or % magics; Colab-only steps are guarded by
IN_COLAB), so each cell is compiled and executed in one shared namespace. A failing cell is reported by number.
`--until=TEXT` stops after the first cell whose source contains TEXT (for tests of the early cells).
"""

import argparse
import json
import sys
import traceback


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("notebook")
    parser.add_argument("--until", default=None, help="stop after the first cell whose source contains this text")
    args = parser.parse_args(argv)
    with open(args.notebook) as handle:
        cells = [cell for cell in json.load(handle)["cells"] if cell["cell_type"] == "code"]
    namespace = {"__name__": "__main__"}
    for number, cell in enumerate(cells, 1):
        source = "".join(cell["source"])
        print(f"--- cell {number} of {len(cells)}", flush=True)
        try:
            exec(compile(source, f"<cell {number}>", "exec"), namespace)
        except BaseException:  # noqa: BLE001 - report which cell failed, whatever it raised.
            traceback.print_exc()
            print(f"NOTEBOOK FAILED at cell {number}", flush=True)
            return 1
        if args.until is not None and args.until in source:
            print(f"NOTEBOOK STOPPED after cell {number}", flush=True)
            return 0
    print("NOTEBOOK OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
