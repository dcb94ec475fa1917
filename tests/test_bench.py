"""bench/throughput.py runs end to end and reports every column, so docs/throughput.md's table can be
re-measured (the benchmark's figures are not asserted: speed targets live in the benchmark, never in tests)."""

import json
import os

import pytest

import forked_python
from helpers import REPO_ROOT


@pytest.mark.slow
def test_the_throughput_benchmark_runs_and_reports_every_column(tmp_path):
    output = tmp_path / "throughput.json"
    result = forked_python.run([os.path.join(REPO_ROOT, "bench", "throughput.py"), "--models=mlp",
                             "--batches=64", "--repetitions=1", "--steps=100", "--rss_steps=0", f"--output={output}"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    case = json.load(open(output))["cases"]["mlp B=64"]
    assert set(case) == {"template SPL=1", "template SPL=10", "template SPL=100", "pipeline",
                         "pipeline, compiled drain", "fixed batch",
                         "keras fit (in memory)", "keras fit (pipeline)", "guide loop", "fixed batch, XLA",
                         "template SPL=100, XLA", "template SPL=100, XLA, tf.data",
                         "keras fit (in memory), XLA", "eval seconds", "checkpoint seconds",
                         "template SPL=100, tf.data", "on-device batches"}
    assert all(value["median"] > 0 for value in case.values())
    assert "| template / keras fit |" in result.stdout and "time to first step" in result.stdout


@pytest.mark.slow
def test_the_xla_comparison_runs_at_2_replicas(tmp_path):
    """`--xla_only` (docs/throughput.md, "XLA"): experiment.jit_compile='on' against 'off', also at 2 replicas."""
    output = tmp_path / "xla.json"
    result = forked_python.run([os.path.join(REPO_ROOT, "bench", "throughput.py"), "--xla_only",
                             "--models=mlp", "--batches=64", "--replicas=2", "--repetitions=1", "--steps=100",
                             f"--output={output}"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    case = json.load(open(output))["cases"]["mlp B=64"]
    assert set(case) == {"template SPL=100", "fixed batch", "template SPL=100, XLA", "fixed batch, XLA",
                         "template SPL=100, XLA, tf.data"}
    assert all(value["median"] > 0 for value in case.values())
    assert "| XLA / no XLA (template SPL=100) |" in result.stdout

@pytest.mark.slow
def test_the_loop_audit_runs_and_reports_every_variant():
    result = forked_python.run([os.path.join(REPO_ROOT, "bench", "loop_audit.py"), "--models=mlp",
                             "--batches=32", "--replicas=1,2", "--repetitions=1"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("| ")}
    assert {"template", "no metrics", "no loss sum", "bare", "template / bare"} <= set(rows), result.stdout
    assert "mlp B=32 R=1" in result.stdout and "mlp B=32 R=2" in result.stdout


@pytest.mark.slow
def test_the_accumulation_memory_benchmark_runs_and_reports_each_k():
    """bench/accumulate_memory.py (docs/throughput.md's peak-RSS figures), at a tiny width: it runs and prints a row
    per k; the figures themselves are not asserted."""
    result = forked_python.run([os.path.join(REPO_ROOT, "bench", "accumulate_memory.py"),
                             "--accumulate=1,4", "--hidden=64", "--batch=64", "--steps=1"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith(("| 1 |", "| 4 |"))]
    assert len(rows) == 2 and "| 4 | 16 |" in rows[1] and "k=4 saves" in result.stdout, result.stdout
