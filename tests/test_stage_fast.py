"""A bad flag or a missing file answers before TensorFlow loads: `python -m stage` (stage/flag_checks.py)
and `train.py` (training/config_files.py checks --gin_file and its includes first) exit 2 with one `error:` line in
a fraction of a second (measured 0.2 s on 2 CPU cores; importing TensorFlow first took 7 s). The bound asserted is a
generous 3 s of wall clock per subprocess; in-process, TensorFlow must not be in sys.modules after the checks.
"""

import os
import subprocess
import sys
import time

import pytest

from helpers import REPO_ROOT

FAST_SECONDS = 3.0


def _timed(*argv: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    result = subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    return result, time.monotonic() - start


def _stage_cases(root) -> dict:
    """{case: (stage arguments, a word of the error line)}; the files are written by the test."""
    base = ["--name=fast", f"--data_dir={root}/tfds"]
    return {
        "missing npz": ([*base, f"--from_npz={root}/nope.npz"], "no such file"),
        "npz folder": ([*base, f"--from_npz={root}"], "is a folder, not a file"),
        "missing CSV of a split": ([*base, f"--from_csv=train={root}/nope.csv,test={root}/one.csv"], "no such file"),
        "missing image folder": ([*base, f"--from_image_folder={root}/nope"], "is not a folder"),
        "bad name": (["--name=Bad-Name", f"--data_dir={root}/tfds", f"--from_csv={root}/one.csv",
                      "--test_fraction=0.2"], "is not a TFDS dataset name"),
        "fraction out of range": ([*base, f"--from_csv={root}/one.csv", "--test_fraction=1.0"], "out of range"),
        "fraction of zero": ([*base, f"--from_csv={root}/one.csv", "--test_fraction=0"], "out of range"),
        "fraction with split files": ([*base, f"--from_csv=train={root}/one.csv,test={root}/one.csv",
                                       "--test_fraction=0.2"], "both say how to split"),
        "fraction with split npz keys": ([*base, f"--from_npz={root}/nope.npz", "--npz_keys=train=a:b,test=c:d",
                                          "--test_fraction=0.2"], "--npz_keys=train=a:b,test=c:d"),
        "fraction with TFRecords": ([*base, "--from_tfrecord=train=a*,test=b*", "--features=x:float32[1],label:int64",
                                     "--test_fraction=0.2"], "--from_tfrecord names its splits"),
        "fraction with a known dataset": ([f"--data_dir={root}/tfds", "--dataset=digits", "--test_fraction=0.2"],
                                          "has its own splits"),
        "one CSV without a fraction": ([*base, f"--from_csv={root}/one.csv"], "--test_fraction=0.2 (say)"),
        "bad image size": ([*base, f"--from_image_folder={root}", "--image_size=32"], "is not a height and width"),
        "zero image size": ([*base, f"--from_image_folder={root}", "--image_size=0,32"], "whole numbers >= 1"),
        "resize without image size": ([*base, f"--from_image_folder={root}", "--resize=pad"],
                                      "--image_size, which is not given"),
        "unknown resize mode": ([*base, f"--from_image_folder={root}", "--image_size=8,8", "--resize=fit"],
                                "is not a resize mode"),
        "bad channels": ([*base, f"--from_image_folder={root}", "--channels=4"], "is not a colour mode"),
        "image flags with a CSV": ([*base, f"--from_csv={root}/one.csv", "--test_fraction=0.2", "--image_size=8,8"],
                                   "the images of --from_image_folder"),
        "image size too large": ([*base, f"--from_image_folder={root}", "--image_size=5000,5000"], "at most 4096"),
        "label with an image folder": ([*base, f"--from_image_folder={root}", "--label=kind"],
                                       "--from_image_folder has its own labels"),
        "seed without a fraction": ([*base, f"--from_csv=train={root}/one.csv,test={root}/one.csv", "--seed=3"],
                                    "--seed=3 seeds the split"),
        "CSV label typo": ([*base, f"--from_csv={root}/one.csv", "--test_fraction=0.2", "--label=lable"],
                           "--label='lable' is not a column of"),
        "CSV column named twice": ([*base, f"--from_csv={root}/repeated.csv", "--test_fraction=0.2"],
                                   "names the column(s) ['a'] more than once"),
        "id column typo": ([*base, f"--from_csv={root}/one.csv", "--test_fraction=0.2", "--id_column=idd"],
                           "--id_column: 'idd' is not a column"),
        "id column of an npz": ([*base, f"--from_npz={root}/one.csv", "--id_column=id"], "names columns of --from_csv"),
        "id column of a text CSV": ([*base, f"--from_csv={root}/one.csv", "--test_fraction=0.2", "--text=a",
                                     "--id_column=a"], "with --text=a the other columns are left out already"),
    }


@pytest.mark.parametrize("case", sorted(_stage_cases("ROOT")))
def test_a_bad_data_stage_flag_exits_2_in_one_line_before_tensorflow_loads(tmp_path, case):
    open(tmp_path / "one.csv", "w").write("a,label\n1,0\n")
    open(tmp_path / "repeated.csv", "w").write("a,b,a,label\n1,2,3,0\n")
    arguments, word = _stage_cases(tmp_path)[case]
    result, seconds = _timed("-m", "stage", *arguments)
    assert result.returncode == 2, (case, result.stderr[-2000:])
    error = result.stderr.strip()
    assert len(error.splitlines()) == 1 and error.startswith("error: ") and word in error, (case, error)
    assert seconds < FAST_SECONDS, (case, seconds)
    assert not os.path.exists(tmp_path / "tfds"), case


def test_an_unknown_data_stage_flag_shows_the_command_to_type(tmp_path):
    """argparse's usage line names `python -m stage`, not `__main__.py`, and comes before TensorFlow loads."""
    result, seconds = _timed("-m", "stage", f"--data_dir={tmp_path}", "--from_cvs=a.csv")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith("usage: python -m stage ") and \
        "unrecognized arguments: --from_cvs=a.csv" in result.stderr, result.stderr[-2000:]
    assert seconds < FAST_SECONDS, seconds


def test_the_data_stage_checks_do_not_import_tensorflow(tmp_path):
    """In a fresh interpreter: parsing and checking a good command line (files present) loads no TensorFlow, and
    a bad one is refused without it either (the negative control: the reader, which refused it before, loads it)."""
    open(tmp_path / "one.csv", "w").write("a,label\n1,0\n")
    code = ("import sys\nfrom stage import cli\nfrom stage.flag_checks import check_args\n"
            "from common.errors import ConfigError\n"
            f"check_args(cli.parse_args(['--name=ok', '--data_dir={tmp_path}/t', '--from_csv={tmp_path}/one.csv', "
            "'--test_fraction=0.5']))\n"
            "try:\n    check_args(cli.parse_args(['--name=ok', '--data_dir=d', '--from_npz=/nope.npz']))\n"
            "except ConfigError:\n    pass\nelse:\n    raise SystemExit('not refused')\n"
            "print('tensorflow' in sys.modules, 'tensorflow_datasets' in sys.modules)\n"
            "from stage import sources\ntry:\n    sources.read_npz('/nope.npz', None)\n"
            "except ConfigError:\n    print('tensorflow' in sys.modules)\n")
    result, _ = _timed("-c", code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "False", "True"], result.stdout


def _train_cases(root) -> dict:
    """{case: (train.py arguments, a word of the error line)}; the files are written by the test."""
    return {
        "missing gin file": ([f"--gin_file={root}/nope.gin"], "does not exist"),
        "gin folder": ([f"--gin_file={root}"], "is a folder, not a gin file"),
        "binary gin file": ([f"--gin_file={root}/binary.gin"], "is not UTF-8 gin text"),
        "unreadable gin file": (["--gin_file=/proc/self/mem"], "cannot be read (Input/output error)"),
        "missing include": ([f"--gin_file={root}/includes_nothing.gin"], "includes 'configs/not_there.gin'"),
        "unknown flag": (["--gin_files=configs/default.gin"], "unrecognized arguments"),
    }


@pytest.mark.parametrize("case", sorted(_train_cases("ROOT")))
def test_a_bad_gin_file_or_flag_of_train_py_exits_2_before_tensorflow_loads(tmp_path, case):
    (tmp_path / "binary.gin").write_bytes(bytes(range(256)))
    (tmp_path / "includes_nothing.gin").write_text("include 'configs/not_there.gin'\n")
    arguments, word = _train_cases(tmp_path)[case]
    result, seconds = _timed("train.py", *arguments, f"--model_dir={tmp_path / 'run'}")
    assert result.returncode == 2, (case, result.stderr[-2000:])
    assert word in result.stderr and "Traceback" not in result.stderr, (case, result.stderr[-2000:])
    assert seconds < FAST_SECONDS, (case, seconds)
    assert not os.path.exists(tmp_path / "run"), case


def test_config_files_check_the_files_before_importing_tensorflow(tmp_path):
    """In a fresh interpreter: a missing --gin_file is refused with TensorFlow not loaded; a good one (the negative
    control) loads it, since the configurable modules are imported to parse it."""
    code = ("import sys\nfrom training import config_files\nfrom common.errors import ConfigError\n"
            "try:\n    config_files.parse(['nope.gin'], [], search_path=config_files.REPO_ROOT)\n"
            "except ConfigError:\n    print('tensorflow' in sys.modules)\n"
            "config_files.parse(['configs/default.gin'], [], search_path=config_files.REPO_ROOT)\n"
            "print('tensorflow' in sys.modules)\n")
    result, _ = _timed("-c", code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "True"], result.stdout


def test_the_printed_command_passes_a_batch_that_fits_a_small_train_split():
    """mnist_cnn.gin's GLOBAL_BATCH_SIZE=128 (read through its includes) is refused by training on a 24-example train
    split: the printed command then passes the largest power of two that fits; a large split gets no batch added
    (the run's length: tests/test_stage_columns.py)."""
    from stage import cli

    assert cli._config_setting(os.path.join(REPO_ROOT, "configs/experiments/mnist_cnn.gin"), "GLOBAL_BATCH_SIZE") == 128
    assert cli._config_setting(os.path.join(REPO_ROOT, "configs/default.gin"), "GLOBAL_BATCH_SIZE") == 64
    assert " --gin_param=GLOBAL_BATCH_SIZE=16 " in cli._sized_run("configs/experiments/mnist_cnn.gin", 24)
    assert "GLOBAL_BATCH_SIZE" not in cli._sized_run("configs/experiments/mnist_cnn.gin", 128)


def test_predict_refuses_an_output_folder_that_does_not_exist_before_predicting(tmp_path, capsys):
    """The predictions used to be computed, then lost in a traceback at open(): now one line, exit 2, first."""
    from tools import predict

    target = tmp_path / "no_such_folder" / "out.csv"
    assert predict.main(["--export=/nowhere", f"--input={tmp_path}", f"--output={target}"]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (f"error: --output={target}: the folder {target.parent} does not exist; create it or pass a path "
                     "in a folder that exists."), error

