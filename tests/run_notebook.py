"""Runs a notebook's code cells top to bottom in this process, like a kernel would: `python tests/run_notebook.py NB`.

No Jupyter needed: the template's notebooks are plain Python (no ! or % magics; Colab-only steps are guarded by
IN_COLAB), so each cell is compiled and executed in one shared namespace. A failing cell is reported by number.
"""

import json
import sys
import traceback


def main(path: str) -> int:
    with open(path) as handle:
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
    print("NOTEBOOK OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
