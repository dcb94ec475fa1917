"""Compare runs side by side: the settings in which their operative configs differ, and their final and best metrics.

    python -m tools.compare runs/a runs/b gs://BUCKET/runs/c [--metric=eval/accuracy] [--plot=curves.png]

Reads each run directory (local or gs://): operative_config.gin (the gin configuration the run used), metrics.json
(the latest summary) and metrics.jsonl (every evaluation; training/run_directory/history.py). Prints one table, a column
per run: the settings that differ, the last step, the final eval metrics, and the best value of `--metric` (default: the
metric the runs kept their best by, else eval/loss) with its step. `--plot` writes a PNG of the eval curves (needs
matplotlib, pinned in requirements-dev.txt; the table needs nothing beyond TensorFlow). Exit 0, or 2 when a path is
not a run directory, its metrics.json is corrupt, or the plot cannot be drawn or written.
"""

import argparse
import re
import sys

from common.errors import ConfigError
from common.storage_paths import join

_BINDING = re.compile(r"^([A-Za-z_][\w./]*)\s*=\s*(.*)$")


def parse_operative_config(text: str) -> dict[str, str]:
    """{'experiment.learning_rate': '0.05', 'LEARNING_RATE': '0.05', ...}: each binding's value as written (values
    spread over several lines are joined; comments skipped)."""
    bindings, name = {}, None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _BINDING.match(line)
        if match and not line[0].isspace():
            name = match.group(1)
            bindings[name] = match.group(2).strip()
        elif name is not None:
            bindings[name] += " " + line.strip()
    return {name: " ".join(value.split()) for name, value in bindings.items()}


class Run:
    """What one run directory holds for comparing."""

    def __init__(self, path: str):
        import tensorflow as tf

        from training.run_directory.history import read_records
        from training.run_directory.layout import HISTORY, OPERATIVE_CONFIG, SUMMARY, RunDirectory

        self.path = path.rstrip("/")
        config_path = join(self.path, OPERATIVE_CONFIG)
        if not tf.io.gfile.exists(config_path):
            raise FileNotFoundError(f"{self.path} is not a run directory (no {OPERATIVE_CONFIG}): pass a model_dir "
                                    "that train.py wrote.")
        with tf.io.gfile.GFile(config_path) as handle:
            self.config = parse_operative_config(handle.read())
        self.summary = RunDirectory(self.path).read_json(SUMMARY) or {}  # A ConfigError naming a corrupt one.
        self.evals = [record for record in read_records(join(self.path, HISTORY))
                      if record["kind"] == "eval"]

    def best(self, metric: str, mode: str) -> tuple[float, int] | None:
        """(value, step) of the best evaluation by `metric` ('eval/NAME'), or None if it was never evaluated."""
        name = metric.split("/", 1)[-1]
        points = [(record["metrics"][name], record["step"]) for record in self.evals if name in record["metrics"]]
        if not points:
            return None
        return (max if mode == "max" else min)(points, key=lambda point: point[0])


def default_metric(runs: list[Run]) -> str:
    """The metric the runs kept their best by (metrics.json "best"), else eval/loss."""
    for run in runs:
        if run.summary.get("best", {}).get("metric"):
            return run.summary["best"]["metric"]
    return "eval/loss"


def recorded_metrics(runs: list[Run]) -> set[str]:
    """Every 'eval/NAME' that at least one run evaluated (metrics.jsonl)."""
    return {f"eval/{name}" for run in runs for record in run.evals for name in record["metrics"]}


def recorded_mode(runs: list[Run], metric: str) -> str | None:
    """The mode ('max' or 'min') a run kept its best `metric` by (metrics.json "best", from BEST_MODE), if any."""
    for run in runs:
        best = run.summary.get("best") or {}
        if best.get("metric") == metric and best.get("mode") in ("max", "min"):
            return best["mode"]
    return None


def table(runs: list[Run], labels: list[str], metric: str) -> str:
    """The comparison as aligned text: a row per differing setting and per metric, a column per run."""
    from training.run_directory.history import resolve_best_mode

    mode = recorded_mode(runs, metric) or resolve_best_mode(metric, "auto")
    keys = sorted(set().union(*(run.config for run in runs)))
    differing = [key for key in keys if len({run.config.get(key, "(unset)") for run in runs}) > 1]
    rows = [("setting / metric", labels)]
    rows += [(key, [run.config.get(key, "(unset)") for run in runs]) for key in differing]
    if not differing:
        rows.append(("(settings)", ["identical"] * len(runs)))
    rows.append(("step", [str(run.summary.get("step", "-")) for run in runs]))
    names = sorted(set().union(*(run.summary.get("eval", {}) for run in runs)))
    for name in names:
        rows.append((f"final eval/{name}", [_number(run.summary.get("eval", {}).get(name)) for run in runs]))
    bests = [run.best(metric, mode) for run in runs]
    rows.append((f"best {metric} ({mode})", [f"{_number(best[0])} @ {best[1]}" if best else "-" for best in bests]))
    width = max(len(name) for name, _ in rows)
    widths = [max(len(values[column]) for _, values in rows) for column in range(len(runs))]
    return "\n".join(f"{name:<{width}}  " + "  ".join(f"{value:<{widths[column]}}" for column, value in
                                                       enumerate(values)).rstrip() for name, values in rows)


def plot(runs: list[Run], labels: list[str], path: str) -> None:
    """A PNG of every eval metric's curve over steps, one line per run (matplotlib, Agg backend, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot
    import tensorflow as tf

    from common.storage_errors import describe

    names = sorted(set().union(*(record["metrics"] for run in runs for record in run.evals)))
    figure, axes = pyplot.subplots(1, max(1, len(names)), figsize=(4.2 * max(1, len(names)), 3.2), squeeze=False)
    for axis, name in zip(axes[0], names, strict=False):
        for run, label in zip(runs, labels, strict=True):
            points = [(record["step"], record["metrics"][name]) for record in run.evals if name in record["metrics"]]
            if points:
                axis.plot(*zip(*points, strict=True), marker="o", markersize=3, label=label)
        axis.set_title(f"eval/{name}")
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    figure.tight_layout()
    try:
        with tf.io.gfile.GFile(path, "wb") as handle:
            figure.savefig(handle, format="png", dpi=80)
    except (tf.errors.OpError, OSError) as error:
        raise ConfigError(f"--plot={path!r} cannot be written ({describe(error)}): pass a path in a folder that exists "
                          "and that you can write to (local or gs://). The table above is complete.") from error
    finally:
        pyplot.close(figure)


def _number(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run directories (model_dir), local or gs://")
    parser.add_argument("--metric", default=None, help="'eval/NAME' to rank by (default: the runs' BEST_METRIC, "
                                                       "else eval/loss)")
    parser.add_argument("--plot", default=None, help="write a PNG of the eval curves to this path (local or gs://)")
    args = parser.parse_args(argv)
    from common.tf_logging import quiet_tensorflow  # Before TensorFlow loads: its C++ start-up lines off.

    quiet_tensorflow()
    try:
        runs = [Run(path) for path in args.runs]
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    labels = [run.path for run in runs]
    if args.metric is not None:
        recorded = recorded_metrics(runs)
        if args.metric not in recorded:
            print(f"error: --metric={args.metric} was not recorded by any of these runs; they recorded "
                  f"{', '.join(sorted(recorded)) or 'no evaluation'}. Pass one of those.", file=sys.stderr)
            return 2
    print(table(runs, labels, args.metric or default_metric(runs)), flush=True)
    if args.plot:
        try:
            plot(runs, labels, args.plot)
        except ImportError:
            print("error: --plot needs matplotlib, which is not installed: pip install -r requirements-dev.txt (or "
                  "pip install matplotlib). The table above needs nothing more.", file=sys.stderr)
            return 2
        except ConfigError as error:  # The path cannot be written.
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"Eval curves written to {args.plot}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
