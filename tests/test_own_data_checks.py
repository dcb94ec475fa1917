"""What `python -m stage --from_...` refuses, each with exit 2, one line naming the value and the fix, and nothing
written: bad inputs (missing files, shapes, NaN/inf, labels, classes only in test, clashing names), and a --name
staged already from another source (stage/fingerprint.py; gs:// in test_gcs.py). Also how labels become classes.
"""

import os
import shutil

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from helpers import write_class_images
from stage import cli as stage


def _stage(*args: str) -> int:
    return stage.main(list(args))


def _write_npz(path, train: int, test: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x_train, x_test = rng.standard_normal((train, 4)), rng.standard_normal((test, 4))
    np.savez(path, x_train=x_train, y_train=(x_train[:, 0] > 0).astype(int), x_test=x_test,
             y_test=(x_test[:, 0] > 0).astype(int))


def _bad_inputs(root) -> dict:
    """{case: (arguments, words the one error line must hold)}."""
    np.savez(f"{root}/wide.npz", x_train=np.zeros((4, 3)), y_train=np.zeros(4, int), x_test=np.zeros((2, 5)),
             y_test=np.zeros(2, int))
    np.savez(f"{root}/negative.npz", x_train=np.zeros((4, 3)), y_train=np.array([1, 1, 0, -1]), x_test=np.zeros((3, 3)),
             y_test=np.array([-2, 1, -2]))
    np.savez(f"{root}/odd_keys.npz", features=np.zeros((4, 3)), labels=np.zeros(4, int))
    with open(f"{root}/train.csv", "w") as handle:
        handle.write("a,b,label\n1,2,0\n3,4,1\n")
    with open(f"{root}/ragged.csv", "w") as handle:
        handle.write("a,b,label\n1,2,0\n3,4,5,1\n")
    with open(f"{root}/nan.csv", "w") as handle:
        handle.write("a,b,label\n1,2,0\n3,nan,1\n")
    with open(f"{root}/inf.csv", "w") as handle:
        handle.write("a,b,label\n1,2,0.5\n3,4,0.25\n5,6,inf\n")
    with open(f"{root}/empty_cell.csv", "w") as handle:
        handle.write("a,b,label\n1,2,0\n3,,1\n")
    with open(f"{root}/text_cell.csv", "w") as handle:
        handle.write("a,colour,label\n1,red,0\n")
    inputs, targets, holes = np.ones((4, 3)), np.ones(4), np.ones((4, 3))
    holes[2, 1] = holes[3, 0] = np.nan
    np.savez(f"{root}/nan.npz", x_train=inputs, y_train=targets, x_test=holes, y_test=targets)
    np.savez(f"{root}/inf.npz", x_train=inputs, y_train=np.array([0.0, 1.0, -np.inf, 1.0]), x_test=inputs,
             y_test=targets)
    with tf.io.TFRecordWriter(f"{root}/nan-0.tfrecord") as writer:
        for row in ([1.0, 2.0], [3.0, float("nan")]):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[0]))})).SerializeToString())
    open(f"{root}/empty-0.tfrecord", "wb").close()
    tfrecords = "--features=x:float32[4],label:int64"
    write_class_images(f"{root}/images", {"train": 2, "test": 1})
    tf.io.write_file(f"{root}/images/test/red/big.png", tf.io.encode_png(np.zeros((9, 9, 3), np.uint8)))
    write_class_images(f"{root}/modes", {"train": 2, "test": 1})
    tf.io.write_file(f"{root}/modes/train/red/gray.png", tf.io.encode_png(np.zeros((8, 8, 1), np.uint8)))
    write_class_images(f"{root}/unseen", {"train": 2, "test": 1})
    os.makedirs(f"{root}/unseen/test/green")
    tf.io.write_file(f"{root}/unseen/test/green/0.png", tf.io.encode_png(np.zeros((8, 8, 3), np.uint8)))
    np.savez(f"{root}/unseen.npz", x_train=np.zeros((4, 3)), y_train=np.array([0, 1, 1, 0]), x_test=np.zeros((3, 3)),
             y_test=np.array([3, 1, 3]))
    return {
        "missing file": ([f"--from_npz={root}/nothing.npz"], ["nothing.npz", "no such file"]),
        "missing CSV file": ([f"--from_csv=train={root}/nothing.csv,test={root}/train.csv"],
                             ["nothing.csv", "no such file", "Pass an existing CSV path"]),
        "wrong field count": ([f"--from_csv=train={root}/ragged.csv,test={root}/train.csv"],
                              ["ragged.csv, line 3: 4 fields, the header has 3", "Fix or remove that line"]),
        "glob without files": ([f"--from_tfrecord=train={root}/none-*.tfrecord,test={root}/none-*.tfrecord",
                                tfrecords], ["none-*.tfrecord", "matches no file", "Check the folder"]),
        "files without records": ([f"--from_tfrecord=train={root}/empty-*.tfrecord,test={root}/empty-*.tfrecord",
                                   tfrecords], ["holds no records", "empty-0.tfrecord", "Check that the glob"]),
        "missing label column": ([f"--from_csv=train={root}/train.csv,test={root}/train.csv", "--label=species"],
                                 ["--label='species'", "columns", "'a', 'b', 'label'"]),
        "inconsistent shapes": ([f"--from_npz={root}/wide.npz"], ["different shapes", "(3,)", "(5,)"]),
        "image shapes": ([f"--from_image_folder={root}/images"],
                         ["big.png", "(9, 9, 3)", "Resize them to one size: pass --image_size=H,W"]),
        "image modes": ([f"--from_image_folder={root}/modes"],
                        ["gray.png is (8, 8, 1)", ".png is (8, 8, 3). Convert them to one colour mode",
                         "(the first is grayscale, the second RGB): pass --channels=3"]),
        "unknown dtype": ([f"--from_tfrecord=train={root}/*.tfrecord,test={root}/*.tfrecord",
                           "--features=x:float16[4],label:int64"], ["float16", "unknown dtype", "float32"]),
        "no test split": ([f"--from_csv=train={root}/train.csv"], ["'train'", "'test'"]),
        "NaN in a CSV feature": ([f"--from_csv=train={root}/nan.csv,test={root}/train.csv"],
                                 ["nan.csv", "split 'train'", "column 'b'", "row index 1 (line 3) is nan",
                                  "Drop those rows"]),
        "empty CSV cell": ([f"--from_csv=train={root}/empty_cell.csv,test={root}/train.csv"],
                           ["empty_cell.csv, line 3: no value in column(s) ['b']",
                            "Fill the missing values in or drop"]),
        "text in a CSV feature": ([f"--from_csv=train={root}/text_cell.csv,test={root}/train.csv"],
                                  ["text_cell.csv, line 2: column 'colour' holds 'red', not a number",
                                   "drop or encode that column"]),
        "inf in a CSV target": ([f"--from_csv=train={root}/train.csv,test={root}/inf.csv"],
                                ["inf.csv", "split 'test'", "column 'label'", "row index 2 (line 4) is inf"]),
        "NaN in npz inputs": ([f"--from_npz={root}/nan.npz"],
                              ["nan.npz", "split 'test'", "array 'x_test'", "row index 2, position 1 is nan"]),
        "inf in npz targets": ([f"--from_npz={root}/inf.npz"],
                               ["split 'train'", "array 'y_train'", "row index 2 is -inf"]),
        "TFRecord feature of another length": ([f"--from_tfrecord=train={root}/nan-*.tfrecord,test={root}/nan-*"
                                                ".tfrecord", "--features=x:float32[7],label:int64"],
                                               ["feature 'x' is stored as float32 with 2 value(s) per record; "
                                                "--features says float32[7]", "--features='x:float32[2],label:int64'"]),
        "TFRecord feature of another dtype": ([f"--from_tfrecord=train={root}/nan-*.tfrecord,test={root}/nan-*"
                                               ".tfrecord", "--features=x:int64[2],label:int64"],
                                              ["feature 'x' is stored as float32 with 2 value(s)", "says int64[2]"]),
        "TFRecord feature that is not stored": ([f"--from_tfrecord=train={root}/nan-*.tfrecord,test={root}/nan-*"
                                                 ".tfrecord", "--features=pixels:image,label:int64", "--label=label"],
                                                ["the records have no feature 'pixels' (they have ['label', 'x'])"]),
        "NaN in a TFRecord": ([f"--from_tfrecord=train={root}/nan-*.tfrecord,test={root}/nan-*.tfrecord",
                               "--features=x:float32[2],label:int64"],
                              ["split 'train'", "feature 'x'", "row index 1, position 1 is nan"]),
        "npz without x_train": ([f"--from_npz={root}/odd_keys.npz"],
                                ["odd_keys.npz", "has the arrays ['features', 'labels']", "x_train",
                                 "--npz_keys=train=INPUTS:LABELS,test=INPUTS:LABELS"]),
        "negative class": ([f"--from_npz={root}/negative.npz"],
                           ["integers >= 0", "split 'train': -1 (1 label); split 'test': -2 (2 labels)",
                            "Number the classes 0, 1, 2", "--label_kind=number"]),
        "image class only in test": ([f"--from_image_folder={root}/unseen"],
                                     ["Split 'test' has classes that split 'train' has no examples of: 'green' (1 "
                                      "example)", "Move some of their examples into train"]),
        "npz class only in test": ([f"--from_npz={root}/unseen.npz"],
                                   ["Split 'test'", "no examples of: '3' (2 examples)", "remove them from 'test'"]),
        "registered name": (["--name=mnist", f"--from_npz={root}/wide.npz"], ["mnist", "--name=my_mnist"]),
        "bundled dataset's name": (["--name=synthetic_reviews", f"--from_npz={root}/wide.npz"],
                                   ["--name='synthetic_reviews'", "data/registry.py", "--name=my_synthetic_reviews"]),
        "bundled builder's name": (["--name=sklearn_digits", f"--from_npz={root}/wide.npz"],
                                   ["DATASET='digits'", "--name=my_sklearn_digits"]),
        "registry entry's name": (["--name=digits", f"--from_npz={root}/wide.npz"],
                                  ["the name of the template's dataset DATASET='digits'", "--name=my_digits"]),
    }


def test_bad_inputs_exit_2_with_one_line_naming_the_value_and_the_fix(tmp_path, capsys):
    for case, (arguments, words) in _bad_inputs(tmp_path).items():
        name = [] if any(arg.startswith("--name") for arg in arguments) else ["--name=bad_data"]
        assert _stage(*name, f"--data_dir={tmp_path}/tfds", *arguments) == 2, case
        error = capsys.readouterr().err.strip()
        assert len(error.splitlines()) == 1 and error.startswith("error: "), (case, error)
        for word in words:
            assert word in error, (case, word, error)
    assert not os.path.exists(f"{tmp_path}/tfds/bad_data"), "nothing is written for bad inputs"


def test_text_labels_become_sorted_class_names_and_float_labels_a_target():
    from stage.columns import columns

    rows = np.zeros((3, 2), np.float32)
    features, staged = columns({"train": (rows, np.array(["iris", "daisy", "rose"])),
                                "test": (rows[:1], np.array(["rose"]))})
    assert features["label"].names == ["daisy", "iris", "rose"]
    np.testing.assert_array_equal(staged["train"]["label"], [1, 0, 2])
    np.testing.assert_array_equal(staged["test"]["label"], [2])
    features, staged = columns({"train": (rows, np.array([0.5, 1.0, 2.0])), "test": (rows, np.array([1.0, 2, 3]))})
    assert set(features.keys()) == {"features", "target"} and staged["train"]["target"].dtype == np.float32
    features, _ = columns({"train": (rows, np.array([0.0, 2.0, 3.0])), "test": (rows, np.array([2.0, 3, 3]))},
                          label_kind="class")
    assert features["label"].num_classes == 4


def test_staging_a_name_again_compares_the_source(tmp_path, capsys):
    """Same source (even moved): nothing to do; another file, other contents or another kind of source: exit 2
    naming both and the fix, nothing written; --force replaces it; a dataset staged before fingerprints were kept
    stays as it is, with a note that the source could not be compared."""
    data_dir, npz = str(tmp_path / "tfds"), str(tmp_path / "rows.npz")
    _write_npz(npz, 40, 10, seed=0)
    version_dir = os.path.join(data_dir, "own_npz", "1.0.0")
    assert _stage("--name=own_npz", f"--data_dir={data_dir}", f"--from_npz={npz}") == 0
    assert os.path.exists(os.path.join(version_dir, "staged_source.json"))
    before = {name: os.stat(os.path.join(version_dir, name)).st_mtime_ns for name in os.listdir(version_dir)}
    shutil.copy(npz, tmp_path / "moved.npz")
    capsys.readouterr()
    for source in (npz, tmp_path / "moved.npz"):
        assert _stage("--name=own_npz", f"--data_dir={data_dir}", f"--from_npz={source}") == 0
        assert "own_npz: already staged from this source in" in capsys.readouterr().out

    _write_npz(tmp_path / "other.npz", 50, 10, seed=1)
    with open(tmp_path / "rows.csv", "w") as handle:
        handle.write("a,b,label\n1,2,0\n3,4,1\n")
    cases = {"other file": ([f"--from_npz={tmp_path}/other.npz"], [f"staged: --from_npz={npz}; now: --from_npz="
                                                                   f"{tmp_path}/other.npz", "the file's contents"]),
             "other kind": ([f"--from_csv=train={tmp_path}/rows.csv,test={tmp_path}/rows.csv"],
                            ["now: --from_csv=train=", "what differs: the kind of source"]),
             "other flags": ([f"--from_npz={npz}", "--label_kind=number"], ["what differs: --label_kind ('auto' "
                                                                             "then, 'number' now)"])}
    for case, (arguments, words) in cases.items():
        assert _stage("--name=own_npz", f"--data_dir={data_dir}", *arguments) == 2, case
        error = capsys.readouterr().err.strip()
        assert len(error.splitlines()) == 1, (case, error)
        for word in (*words, f"--name='own_npz' is already staged in {data_dir} from another source", "--force",
                     "another --name (e.g. --name=own_npz_2)"):
            assert word in error, (case, word, error)
    assert {name: os.stat(os.path.join(version_dir, name)).st_mtime_ns for name in os.listdir(version_dir)} == before

    assert _stage("--name=own_npz", f"--data_dir={data_dir}", f"--from_npz={tmp_path}/other.npz", "--force") == 0
    assert tfds.builder("own_npz", data_dir=data_dir).info.splits["train"].num_examples == 50
    assert _stage("--name=own_npz", f"--data_dir={data_dir}", f"--from_npz={tmp_path}/other.npz") == 0
    assert "already staged from this source" in capsys.readouterr().out

    os.remove(os.path.join(version_dir, "staged_source.json"))  # As staged before fingerprints were kept.
    assert _stage("--name=own_npz", f"--data_dir={data_dir}", f"--from_npz={npz}") == 0
    out = capsys.readouterr().out
    assert "own_npz: already staged in" in out and "cannot compare" in out and "pass --force" in out, out
    assert tfds.builder("own_npz", data_dir=data_dir).info.splits["train"].num_examples == 50  # Left as it was.


def test_an_image_folder_staged_again_is_compared_by_its_files(tmp_path, capsys):
    write_class_images(str(tmp_path / "images"), {"train": 2, "test": 1})
    arguments = ["--name=own_folder", f"--data_dir={tmp_path}/tfds", f"--from_image_folder={tmp_path}/images"]
    assert _stage(*arguments) == 0
    assert _stage(*arguments) == 0 and "already staged from this source" in capsys.readouterr().out
    tf.io.write_file(f"{tmp_path}/images/train/red/0.png", tf.io.encode_png(np.full((8, 8, 3), 7, np.uint8)))
    assert _stage(*arguments) == 2
    assert "the image files (names, sizes or modification times)" in capsys.readouterr().err
