"""What `python -m stage` refuses that it used to crash on or stage broken (exit 2, one `error:` line naming the
file or value and the fix, nothing written), and a resume refused on other staged data than the checkpoint's run
trained on (stage/fingerprint.py's fingerprint in run_identity.json).
"""

import json
import os
import shutil

import numpy as np
import tensorflow as tf

from helpers import run_train_py, write_class_images
from stage import cli as stage

TINY = ["--gin_file=configs/experiments/breast_cancer_mlp.gin", "--gin_param=STEPS_PER_LOOP=10",
        "--gin_param=EVAL_EVERY=0", "--gin_param=CHECKPOINT_EVERY=0", "--gin_param=GLOBAL_BATCH_SIZE=16",
        "--gin_param=cosine.warmup_steps=2", "--gin_param=experiment.metrics=['accuracy']"]


def _write_npz(path, train: int = 40, test: int = 10, seed: int = 0, scale: float = 1.0, **replace) -> None:
    rng = np.random.default_rng(seed)
    arrays = {"x_train": rng.standard_normal((train, 4)) * scale, "x_test": rng.standard_normal((test, 4)) * scale}
    arrays.update(y_train=(arrays["x_train"][:, 0] > 0).astype(int), y_test=(arrays["x_test"][:, 0] > 0).astype(int))
    np.savez(path, **{**arrays, **replace})


def _refusals(root) -> dict:
    """{case: (source arguments, words the one error line must hold)}."""
    with open(f"{root}/latin1.csv", "wb") as handle:
        handle.write("größe,label\n1.5,0\n2.5,1\n".encode("latin-1"))
    with open(f"{root}/binary.csv", "wb") as handle:
        handle.write(bytes(range(256)) * 4)
    with open(f"{root}/nul.csv", "wb") as handle:
        handle.write(b"a,label\n1,0\n\x00\x00,1\n")
    with open(f"{root}/ok.csv", "w") as handle:
        handle.write("a,label\n1,0\n2,1\n")
    with open(f"{root}/only_label.csv", "w") as handle:
        handle.write("label\n0\n1\n")
    os.makedirs(f"{root}/npz_folder")
    _write_npz(f"{root}/zero_width.npz", x_train=np.zeros((40, 0)), x_test=np.zeros((10, 0)))
    labels = np.random.default_rng(0).choice([0, 2_000_000_000], 40)
    _write_npz(f"{root}/huge_labels.npz", y_train=labels, y_test=labels[:10])
    _write_npz(f"{root}/complex_inputs.npz", x_train=np.ones((40, 4)) * (1 + 2j), x_test=np.ones((10, 4)) * (1 + 2j))
    _write_npz(f"{root}/complex_labels.npz", y_train=np.ones(40) * 1j, y_test=np.ones(10) * 1j)
    write_class_images(f"{root}/images", {"train": 2, "test": 1})
    os.makedirs(f"{root}/images/train/green")
    return {
        "Latin-1 CSV": ([f"--from_csv=train={root}/latin1.csv,test={root}/ok.csv"],
                        [f"{root}/latin1.csv is not UTF-8 text", "byte 0xf6", "save it as CSV in UTF-8"]),
        "binary CSV": ([f"--from_csv=train={root}/ok.csv,test={root}/binary.csv"],
                       [f"{root}/binary.csv is not UTF-8 text", "save it as CSV in UTF-8"]),
        "CSV with NUL bytes": ([f"--from_csv=train={root}/nul.csv,test={root}/ok.csv"],
                               [f"{root}/nul.csv holds NUL bytes", "export it as CSV in UTF-8"]),
        "CSV folder": ([f"--from_csv=train={root}/npz_folder,test={root}/ok.csv"],
                       ["npz_folder'", "a folder, not a file", "Pass an existing CSV path"]),
        "npz folder": ([f"--from_npz={root}/npz_folder"], ["npz_folder'", "is a folder, not a file", ".npz file"]),
        "zero-width npz": ([f"--from_npz={root}/zero_width.npz"],
                           ["zero_width.npz: The inputs have shape (0,) per example", "at least one feature"]),
        "CSV of only the label": ([f"--from_csv=train={root}/only_label.csv,test={root}/only_label.csv"],
                                  ["shape (0,) per example", "a column besides --label"]),
        "huge class labels": ([f"--from_npz={root}/huge_labels.npz"],
                              [f"--from_npz={root}/huge_labels.npz: The labels go up to 2000000000",
                               "2,000,000,001 classes", "for 50 examples with 2 distinct labels",
                               "refuses more classes than examples (above 1,000)", "Number the classes 0..1",
                               "--label_kind=number"]),
        "complex inputs": ([f"--from_npz={root}/complex_inputs.npz"],
                           ["complex_inputs.npz: The inputs are complex numbers (complex128)", "imaginary part",
                            "x.real, x.imag"]),
        "complex labels": ([f"--from_npz={root}/complex_labels.npz"], ["labels are complex numbers", "imaginary"]),
        "empty class folder": ([f"--from_image_folder={root}/images"],
                               [f"class folder {root}/images/train/green has no", "images", "remove the folder"]),
    }


def test_unreadable_or_untrainable_sources_exit_2_naming_them_before_anything_is_written(tmp_path, capsys):
    for case, (arguments, words) in _refusals(tmp_path).items():
        assert stage.main(["--name=bad_data", f"--data_dir={tmp_path}/tfds", *arguments]) == 2, case
        error = capsys.readouterr().err.strip()
        assert len(error.splitlines()) == 1 and error.startswith("error: "), (case, error)
        for word in words:
            assert word in error, (case, word, error)
    assert not os.path.exists(f"{tmp_path}/tfds/bad_data"), "nothing is written for refused inputs"


def test_what_is_still_staged_sparse_labels_utf8_with_a_byte_order_mark_and_empty_folders_elsewhere(tmp_path):
    """Negative controls: class ids with gaps (up to 1,000, or up to the number of examples), a UTF-8 CSV with
    Excel's byte-order mark (the mark is not part of the first column's name), an image folder whose split folder
    holds a stray empty non-class file."""
    from stage.columns import columns

    rows = np.zeros((40, 2), np.float32)
    features, _ = columns({"train": (rows, np.arange(40) % 2 * 999), "test": (rows[:2], np.array([0, 999]))})
    assert features["label"].num_classes == 1000
    features, _ = columns({"train": (np.zeros((2000, 2)), np.arange(2000) % 2 * 1999),
                           "test": (rows[:2], np.array([0, 1999]))})
    assert features["label"].num_classes == 2000
    with open(tmp_path / "bom.csv", "wb") as handle:
        handle.write("a,label\n1.5,0\n2.5,1\n".encode("utf-8-sig"))
    assert stage.main(["--name=bom", f"--data_dir={tmp_path}/tfds", "--label=a",
                       f"--from_csv=train={tmp_path}/bom.csv,test={tmp_path}/bom.csv"]) == 0
    write_class_images(f"{tmp_path}/images", {"train": 2, "test": 1})
    open(f"{tmp_path}/images/train/notes.txt", "w").close()
    assert stage.main(["--name=images", f"--data_dir={tmp_path}/tfds", f"--from_image_folder={tmp_path}/images"]) == 0


def _train(data_dir: str, model_dir: str, steps: int):
    return run_train_py(*TINY, f"--gin_param=TRAIN_STEPS={steps}", "--gin_param=DATASET='tfds:rows'",
                        f"--gin_param=DATA_DIR='{data_dir}'", f"--model_dir={model_dir}")


def test_a_resume_on_restaged_other_data_is_refused_and_on_the_same_data_resumes(tmp_path):
    """`python -m stage --force` with other data under a run's dataset: the rerun exits 2 naming both fingerprints,
    their sources and the fix, before training (the checkpoint stays as it was); restaged from the same data, it
    resumes."""
    from data.staged_source import digest

    data_dir, model_dir = str(tmp_path / "tfds"), str(tmp_path / "run")
    _write_npz(tmp_path / "rows.npz")
    _write_npz(tmp_path / "doubled.npz", scale=2.0)
    stage_flags = ["--name=rows", f"--data_dir={data_dir}", "--force"]
    assert stage.main([*stage_flags, f"--from_npz={tmp_path}/rows.npz"]) == 0
    first = _train(data_dir, model_dir, 10)
    assert first.returncode == 0, first.stderr[-3000:]
    identity = json.load(open(f"{model_dir}/run_identity.json"))
    assert identity["DATA_VERSION"] == "rows 1.0.0"
    staged = identity["DATA_FINGERPRINT"]

    assert stage.main([*stage_flags, f"--from_npz={tmp_path}/doubled.npz"]) == 0
    other = json.load(open(f"{data_dir}/rows/1.0.0/staged_source.json"))
    checkpoints = sorted(os.listdir(f"{model_dir}/checkpoints"))
    refused = _train(data_dir, model_dir, 20)
    assert refused.returncode == 2, refused.stderr[-3000:]
    error = refused.stderr.strip().splitlines()[-1]
    for word in (f"{model_dir} holds a checkpoint of a run on other data", f"DATASET='tfds:rows' in {data_dir} was "
                 "staged again from another source", f"the checkpoint's {staged} from --from_npz={tmp_path}/rows.npz, "
                 f"staged 20", f"now {digest(other)} from --from_npz={tmp_path}/doubled.npz, staged {other['staged']}",
                 "pass a new --model_dir", "stage the old data again"):
        assert word in error, (word, error)
    assert digest(other) != staged
    assert sorted(os.listdir(f"{model_dir}/checkpoints")) == checkpoints
    assert json.load(open(f"{model_dir}/run_identity.json")) == identity

    shutil.copy(tmp_path / "rows.npz", tmp_path / "rows_again.npz")  # The same data, staged anew (another path).
    assert stage.main([*stage_flags, f"--from_npz={tmp_path}/rows_again.npz"]) == 0
    resumed = _train(data_dir, model_dir, 20)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 10." in resumed.stdout + resumed.stderr and "Resumed from" in resumed.stdout + resumed.stderr
    assert json.load(open(f"{model_dir}/run_identity.json"))["DATA_FINGERPRINT"] == staged


def test_a_run_identity_without_a_data_fingerprint_still_resumes_and_builtin_data_records_its_version(tmp_path):
    """run_identity.json of an older version of the template has no DATA: not compared. A registered dataset records
    its TFDS name and version (a TFDS upgrade that changes it is refused like other data)."""
    from common.errors import ConfigError
    from training.run_directory.identity import check_resume, data_identity

    current = {"DATASET": "tfds:rows", "DATA_VERSION": "rows 1.0.0", "DATA_FINGERPRINT": "0123456789abcdef",
               "DATA_STAGED": "--from_npz=a.npz, staged x"}
    check_resume({"DATASET": "tfds:rows"}, current, model_dir="run")
    check_resume({**current, "DATA_STAGED": "--from_npz=b.npz, staged y"}, current, model_dir="run")
    for changed in ({"DATA_FINGERPRINT": "fedcba9876543210"}, {"DATA_VERSION": "rows 2.0.0"}):
        try:
            check_resume({**current, **changed}, current, model_dir="run")
        except ConfigError as error:
            assert all(value in str(error) for value in (*changed.values(), current[next(iter(changed))])), error
        else:
            raise AssertionError(f"resumed on other data: {changed}")
    # Restaged from the same folder at another size: the message names the flag that changed, both ways.
    sized = {**current, "DATA_STAGED_SETTINGS": {"image_size": "64,64", "resize": "pad"}}
    try:
        check_resume({**sized, "DATA_FINGERPRINT": "fedcba9876543210",
                      "DATA_STAGED_SETTINGS": {"image_size": "32,32", "resize": "pad"}}, sized, model_dir="run")
    except ConfigError as error:
        assert "was staged again with --image_size=64,64 (the checkpoint's data: --image_size=32,32) since" in \
            str(error) and "--resize" not in str(error), error
    else:
        raise AssertionError("resumed on data staged at another size")

    class Builtin:
        name, version, data_dir = "sklearn_digits", "1.0.0", str(tmp_path)

    assert data_identity(Builtin()) == {"DATA_VERSION": "sklearn_digits 1.0.0"}
    assert not tf.io.gfile.exists(os.path.join(tmp_path, "staged_source.json"))
