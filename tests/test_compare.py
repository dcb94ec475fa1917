"""tools.compare on run directories written here by hand (no training): the best row ranks by the mode the run
recorded, and a corrupt metrics.json or a --plot path that cannot be written is one error line naming the file and
the fix (exit 2), as is a --metric no run recorded."""

import json
import os

from tools import compare

EVALS = [(10, 5.0), (20, 3.0), (30, 4.0)]  # (step, perplexity): lower is better, which 'auto' cannot know.


def _run_dir(root, name: str, *, summary: str | None = None) -> str:
    path = os.path.join(root, name)
    os.makedirs(path)
    with open(os.path.join(path, "operative_config.gin"), "w") as handle:
        handle.write(f"SEED = {len(name)}\nexperiment.seed = %SEED\n")
    with open(os.path.join(path, "metrics.jsonl"), "w") as handle:
        for step, value in EVALS:
            handle.write(json.dumps({"kind": "eval", "step": step, "metrics": {"perplexity": value}}) + "\n")
    if summary is None:
        summary = json.dumps({"step": 30, "train": {}, "eval": {"perplexity": 4.0},
                              "best": {"metric": "eval/perplexity", "mode": "min", "step": 20, "value": 3.0}})
    with open(os.path.join(path, "metrics.json"), "w") as handle:
        handle.write(summary)
    return path


def test_the_best_row_uses_the_mode_the_run_recorded(tmp_path, capsys):
    """BEST_MODE='min' for a metric 'auto' would maximise (perplexity): compare ranks as the run did."""
    assert compare.main([_run_dir(tmp_path, "a"), _run_dir(tmp_path, "bb")]) == 0
    best_row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("best "))
    assert best_row.startswith("best eval/perplexity (min)") and best_row.split()[-3:] == ["3.0000", "@", "20"]


def test_a_corrupt_metrics_json_names_the_file_and_the_fix(tmp_path, capsys):
    run = _run_dir(tmp_path, "a", summary='{"step": 30, "eval": {')  # Cut short, as by a full disk.
    assert compare.main([run]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: {run}/metrics.json is corrupt (not JSON: ") and "delete it" in error, error


def test_a_plot_path_that_cannot_be_written_names_it(tmp_path, capsys):
    target = str(tmp_path / "no_such_folder" / "curves.png")
    assert compare.main([_run_dir(tmp_path, "a"), f"--plot={target}"]) == 2
    captured = capsys.readouterr()
    assert "best eval/perplexity" in captured.out  # The table was printed first.
    assert captured.err.strip().startswith(f"error: --plot={target!r} cannot be written (") and \
        "pass a path in a folder that exists" in captured.err, captured.err


def test_a_metric_no_run_recorded_is_exit_2_naming_the_recorded_ones(tmp_path, capsys):
    """A typo in --metric used to print a row of dashes and exit 0; the recorded name (the negative control) ranks."""
    runs = [_run_dir(tmp_path, "a"), _run_dir(tmp_path, "bb")]
    assert compare.main([*runs, "--metric=eval/acuracy"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == ("error: --metric=eval/acuracy was not recorded by any of these runs; they "
                                    "recorded eval/perplexity. Pass one of those."), captured.err
    assert compare.main([*runs, "--metric=eval/perplexity"]) == 0


def test_the_usage_line_names_the_command_to_type(capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        compare.main(["--no_such_flag"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("usage: python -m tools.compare ")
