"""The printed table of bench/throughput.py's results (examples/s, seconds, and the ratios the targets are about)."""


def table(results: dict) -> str:
    cases = list(results["cases"])
    columns = list(dict.fromkeys(column for case in cases for column in results["cases"][case]))
    lines = [f"examples/s (median of repetitions), {results['replicas']} replica(s), {results['date']}, load "
             f"{results['load_before'][0]:.1f} -> {results['load_after'][0]:.1f}",
             "| | " + " | ".join(cases) + " |", "|---" * (len(cases) + 1) + "|"]

    def cell(case, column):
        value = results["cases"][case].get(column)
        if value is None:
            return "-"
        return f"{value['median']:.2f} s" if column.endswith("seconds") else f"{value['median'] / 1000:.1f}k"

    def ratio(case, numerator, denominator):
        values = results["cases"][case]
        if numerator not in values or denominator not in values:
            return "-"
        return f"{values[numerator]['median'] / values[denominator]['median']:.2f}"

    for column in columns:
        lines.append(f"| {column} | " + " | ".join(cell(case, column) for case in cases) + " |")
    for name, numerator, denominator in (("template / keras fit", "template SPL=100", "keras fit (in memory)"),
                                         ("template / fixed batch", "template SPL=100", "fixed batch"),
                                         ("pipeline / template", "pipeline", "template SPL=100"),
                                         ("compiled drain / template", "pipeline, compiled drain",
                                          "template SPL=100"),
                                         ("compiled drain / template tf.data", "pipeline, compiled drain",
                                          "template SPL=100, tf.data"),
                                         ("on-device batches / template", "on-device batches", "template SPL=100"),
                                         ("on device / tf.data (SPL=100)", "template SPL=100",
                                          "template SPL=100, tf.data"),
                                         ("SPL=100 / SPL=1", "template SPL=100", "template SPL=1"),
                                         ("XLA: fixed batch / keras fit", "fixed batch, XLA",
                                          "keras fit (in memory), XLA"),
                                         ("XLA / no XLA (fixed batch)", "fixed batch, XLA", "fixed batch"),
                                         ("XLA / no XLA (template SPL=100)", "template SPL=100, XLA",
                                          "template SPL=100")):
        lines.append(f"| {name} | " + " | ".join(ratio(case, numerator, denominator) for case in cases) + " |")
    first = results["time_to_first_step"]
    if first:
        lines.append("time to first step: " + ", ".join(f"{key} {value:.1f} s" for key, value in first.items()))
    if "rss" in results:
        rss = results["rss"]
        lines.append(f"RSS over {rss['steps']:,} MLP steps: {rss['rss_mb_after_100']:.0f} -> {rss['rss_mb_after']:.0f}"
                     f" MB ({rss['growth_mb']:+.0f} MB)")
    return "\n".join(lines)
