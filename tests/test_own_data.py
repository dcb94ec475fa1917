"""Bring your own data: each source (.npz arrays, CSV, TFRecord + feature spec, image folder) staged with
`python -m data.stage --from_...` becomes a TFDS dataset whose metadata holds its features and split sizes, and trains
by name (`DATASET='tfds:NAME'`) through train.py, locally and from gs:// (loopback server); --force rebuilds, a second
stage without it writes nothing; bad inputs exit 2 with one line; a staged tabular dataset's export serves raw rows.

The data are generated here, learnable from raw values on very different scales (so the task's standardisation
matters); one data_dir per module holds every staged dataset.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from data import stage
from helpers import REPO_ROOT, run_module, run_train_py

TINY = ["--gin_param=TRAIN_STEPS=60", "--gin_param=STEPS_PER_LOOP=20", "--gin_param=EVAL_EVERY=0",
        "--gin_param=CHECKPOINT_EVERY=0", "--gin_param=cosine.warmup_steps=5", "--gin_param=GLOBAL_BATCH_SIZE=32"]
TABULAR = ["--gin_file=configs/experiments/breast_cancer_mlp.gin", "--gin_param=LEARNING_RATE=0.05"]
SCALES, OFFSETS = np.array([100.0, 0.01, 5.0, 1.0]), np.array([-300.0, 2.0, 40.0, 0.0])


def _rows(count: int, seed: int):
    """Raw feature rows on different scales and offsets, two classes by the sign of (x0 + x1) of the standard parts."""
    standard = np.random.default_rng(seed).standard_normal((count, 4))
    return (standard * SCALES + OFFSETS).astype(np.float32), (standard[:, 0] + standard[:, 1] > 0).astype(np.int64)


def _stage(*args: str) -> int:
    return stage.main(list(args))


def _write_images(root: str, sizes: dict, shape=(8, 8, 3)) -> None:
    """root/SPLIT/CLASS/*.png: 'red' images are bright in channel 0, 'blue' in channel 2 (plus noise)."""
    rng = np.random.default_rng(1)
    for split, count in sizes.items():
        for channel, name in ((0, "red"), (2, "blue")):
            os.makedirs(f"{root}/{split}/{name}")
            for index in range(count):
                image = rng.integers(0, 90, shape).astype(np.uint8)
                image[..., channel] += 150
                tf.io.write_file(f"{root}/{split}/{name}/{index}.png", tf.io.encode_png(image))


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> dict:
    """One data_dir with four staged datasets (one per source) and the raw inputs they came from."""
    root = tmp_path_factory.mktemp("own")
    data_dir, inputs = str(root / "tfds"), {}
    x_train, y_train = _rows(400, 0)
    x_test, y_test = _rows(100, 1)
    inputs["npz"] = str(root / "rows.npz")
    np.savez(inputs["npz"], x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    assert _stage("--name=own_npz", f"--data_dir={data_dir}", f"--from_npz={inputs['npz']}") == 0

    for split, (x, y) in (("train", (x_train, y_train)), ("test", (x_test, y_test))):
        target = (x[:, 0] - OFFSETS[0]) / SCALES[0] - 2 * (x[:, 2] - OFFSETS[2]) / SCALES[2]  # From raw columns.
        with open(root / f"{split}.csv", "w") as handle:
            handle.write("a,b,c,d,price\n" + "".join(f"{a},{b},{c},{d},{t:.4f}\n" for (a, b, c, d), t in
                                                       zip(x.tolist(), target.tolist(), strict=True)))
        with tf.io.TFRecordWriter(str(root / f"{split}-00000.tfrecord")) as writer:
            for row, label in zip(x, y, strict=True):
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))})).SerializeToString())
    assert _stage("--name=own_csv", f"--data_dir={data_dir}", f"--from_csv=train={root}/train.csv,"
                  f"test={root}/test.csv", "--label=price") == 0
    assert _stage("--name=own_tfrecord", f"--data_dir={data_dir}", f"--from_tfrecord=train={root}/train-*.tfrecord,"
                  f"test={root}/test-*.tfrecord", "--features=x:float32[4],y:int64", "--label=y") == 0
    _write_images(str(root / "images"), {"train": 40, "test": 10})
    assert _stage("--name=own_images", f"--data_dir={data_dir}", f"--from_image_folder={root}/images") == 0
    return {"data_dir": data_dir, "root": root, "inputs": inputs, "test": (x_test, y_test)}


def test_each_source_is_a_tfds_dataset_with_features_and_split_sizes_in_its_metadata(staged):
    features = {"own_npz": ("features", "label"), "own_csv": ("features", "target"),
                "own_tfrecord": ("features", "label"), "own_images": ("image", "label")}
    sizes = {"own_npz": (400, 100), "own_csv": (400, 100), "own_tfrecord": (400, 100), "own_images": (80, 20)}
    for name, keys in features.items():
        info = tfds.builder_from_directory(os.path.join(staged["data_dir"], name, "1.0.0")).info
        assert tuple(sorted(info.features.keys())) == tuple(sorted(keys)), (name, info.features)
        assert (info.splits["train"].num_examples, info.splits["test"].num_examples) == sizes[name]
    images = tfds.builder_from_directory(os.path.join(staged["data_dir"], "own_images", "1.0.0")).info.features
    assert images["image"].shape == (8, 8, 3) and images["label"].names == ["blue", "red"]
    rows = tfds.as_numpy(tfds.builder("own_tfrecord", data_dir=staged["data_dir"]).as_dataset("test", batch_size=-1))
    np.testing.assert_array_equal(rows["features"], staged["test"][0])  # Same rows, same order, as the files.
    np.testing.assert_array_equal(rows["label"], staged["test"][1])


@pytest.mark.parametrize("name, config, metric, bound", [
    ("own_npz", TABULAR, "accuracy", 0.85),
    ("own_tfrecord", TABULAR, "accuracy", 0.85),
    ("own_csv", ["--gin_file=configs/experiments/synthetic_housing_mlp.gin"], "mean_absolute_error", 1.0),
    ("own_images", ["--gin_file=configs/experiments/digits_mlp.gin"], "accuracy", 0.9),
])
def test_each_staged_source_trains_by_name(staged, tmp_path, name, config, metric, bound):
    model_dir = str(tmp_path / "run")
    result = run_train_py(*config, *TINY, f"--gin_param=DATASET='tfds:{name}'",
                          f"--gin_param=DATA_DIR='{staged['data_dir']}'", f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    value = json.load(open(os.path.join(model_dir, "metrics.json")))["eval"][metric]
    assert value >= bound if metric == "accuracy" else value <= bound, result.stdout[-1500:]
    if name == "own_npz":  # The export serves raw rows (not standardised ones) and standardises them itself.
        served = tf.saved_model.load(f"{model_dir}/export/60").signatures["serving_default"]
        rows, labels = staged["test"]
        outputs = served(features=tf.constant(rows))
        assert np.mean(outputs["classes"].numpy() == labels) >= 0.85
        assert set(outputs["class_names"].numpy().tolist()) <= {b"0", b"1"}


def test_a_second_stage_does_nothing_and_force_rebuilds(staged, capsys):
    data_dir, version_dir = staged["data_dir"], os.path.join(staged["data_dir"], "own_npz", "1.0.0")
    before = {name: os.stat(os.path.join(version_dir, name)).st_mtime_ns for name in os.listdir(version_dir)}
    assert _stage("--name=own_npz", f"--data_dir={data_dir}", f"--from_npz={staged['inputs']['npz']}") == 0
    assert "already staged" in capsys.readouterr().out
    assert {name: os.stat(os.path.join(version_dir, name)).st_mtime_ns for name in os.listdir(version_dir)} == before

    smaller = str(staged["root"] / "smaller.npz")
    (x, y), (x_test, y_test) = _rows(50, 2), _rows(10, 3)
    np.savez(smaller, x_train=x, y_train=y, x_test=x_test, y_test=y_test)
    copy = os.path.join(staged["root"], "force")
    assert _stage("--name=own_npz", f"--data_dir={copy}", f"--from_npz={staged['inputs']['npz']}") == 0
    assert _stage("--name=own_npz", f"--data_dir={copy}", f"--from_npz={smaller}", "--force") == 0
    info = tfds.builder("own_npz", data_dir=copy).info
    assert (info.splits["train"].num_examples, info.splits["test"].num_examples) == (50, 10)


def test_staging_a_name_again_compares_the_source(staged, tmp_path, capsys):
    """Same source (even moved): nothing to do; another file, other contents or another kind of source: exit 2
    naming both and the fix, nothing written; --force replaces it; a dataset staged before fingerprints were kept
    stays as it is, with a note that the source could not be compared."""
    data_dir, npz = str(tmp_path / "tfds"), staged["inputs"]["npz"]
    version_dir = os.path.join(data_dir, "own_npz", "1.0.0")
    assert _stage("--name=own_npz", f"--data_dir={data_dir}", f"--from_npz={npz}") == 0
    assert os.path.exists(os.path.join(version_dir, "staged_source.json"))
    before = {name: os.stat(os.path.join(version_dir, name)).st_mtime_ns for name in os.listdir(version_dir)}
    shutil.copy(npz, tmp_path / "moved.npz")
    capsys.readouterr()
    for source in (npz, tmp_path / "moved.npz"):
        assert _stage("--name=own_npz", f"--data_dir={data_dir}", f"--from_npz={source}") == 0
        assert "own_npz: already staged from this source in" in capsys.readouterr().out

    (x, y), (x_test, y_test) = _rows(50, 2), _rows(10, 3)
    np.savez(tmp_path / "other.npz", x_train=x, y_train=y, x_test=x_test, y_test=y_test)
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
    _write_images(str(tmp_path / "images"), {"train": 2, "test": 1})
    arguments = ["--name=own_folder", f"--data_dir={tmp_path}/tfds", f"--from_image_folder={tmp_path}/images"]
    assert _stage(*arguments) == 0
    assert _stage(*arguments) == 0 and "already staged from this source" in capsys.readouterr().out
    tf.io.write_file(f"{tmp_path}/images/train/red/0.png", tf.io.encode_png(np.full((8, 8, 3), 7, np.uint8)))
    assert _stage(*arguments) == 2
    assert "the image files (names, sizes or modification times)" in capsys.readouterr().err


@pytest.mark.slow
def test_own_data_stages_into_gcs_and_trains_from_there(staged, gcs, gcs_bucket, tmp_path):
    data_dir = f"gs://{gcs_bucket}/tensorflow_datasets"
    result = run_module("data.stage", "--name=own_npz", f"--data_dir={data_dir}",
                        f"--from_npz={staged['inputs']['npz']}")
    assert result.returncode == 0 and "own_npz: built into" in result.stdout, result.stderr[-3000:]
    assert ("--gin_file=configs/experiments/breast_cancer_mlp.gin --gin_param=\"DATASET='tfds:own_npz'\"" in
            result.stdout and "TabularClassification(num_features=4)" in result.stdout), result.stdout
    names = gcs.object_names(gcs_bucket, "tensorflow_datasets/own_npz/1.0.0/")
    assert any(name.endswith("dataset_info.json") for name in names), names
    trained = run_train_py(*TABULAR, *TINY, "--gin_param=DATASET='tfds:own_npz'", f"--gin_param=DATA_DIR='{data_dir}'",
                           f"--model_dir={tmp_path / 'run'}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "'accuracy': " in trained.stdout

    info = "tensorflow_datasets/own_npz/1.0.0/dataset_info.json"
    generation = gcs.client().bucket(gcs_bucket).get_blob(info).generation
    assert _stage("--name=own_npz", f"--data_dir={data_dir}", f"--from_npz={staged['inputs']['npz']}") == 0
    assert gcs.client().bucket(gcs_bucket).get_blob(info).generation == generation  # Nothing rewritten.
    assert _stage("--name=own_npz", f"--data_dir={data_dir}", f"--from_npz={staged['inputs']['npz']}", "--force") == 0
    assert gcs.client().bucket(gcs_bucket).get_blob(info).generation != generation  # Deleted and stored anew.
    assert tfds.builder("own_npz", data_dir=data_dir).info.splits["train"].num_examples == 400


def test_the_printed_training_command_runs_for_three_classes(tmp_path, capsys):
    """The command data.stage prints, copied verbatim (only shortened, and its model_dir moved to tmp_path), trains a
    3-class tabular dataset: the starting config's two-class metrics (AUC, precision, recall) are replaced."""
    standard = np.random.default_rng(4).standard_normal((300, 4))
    rows, labels = (standard * SCALES + OFFSETS).astype(np.float32), np.digitize(standard[:, 0], [-0.5, 0.5])
    np.savez(tmp_path / "three.npz", x_train=rows[:240], y_train=labels[:240], x_test=rows[240:], y_test=labels[240:])
    assert _stage("--name=three_classes", f"--data_dir={tmp_path}/tfds", f"--from_npz={tmp_path}/three.npz") == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("Train it: ")]
    command = shlex.split(line[len("Train it: "):])
    assert command[:2] == ["python", "train.py"] and "TabularClassification(num_features=4, num_classes=3)" in out, out
    result = subprocess.run([sys.executable, *command[1:], *TINY, f"--model_dir={tmp_path / 'run'}"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert set(json.load(open(tmp_path / "run" / "metrics.json"))["eval"]) >= {"accuracy"}


def test_a_dataset_that_is_not_staged_names_the_stage_command_in_one_line(tmp_path):
    result = run_train_py(*TABULAR, *TINY, "--gin_param=DATASET='tfds:not_staged_here'",
                          f"--gin_param=DATA_DIR='{tmp_path}'", f"--model_dir={tmp_path / 'run'}", timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
    assert "python -m data.stage --name=not_staged_here" in result.stderr and "--from_npz" in result.stderr


def test_a_bundled_builder_stages_by_its_tfds_name(tmp_path):
    """In a fresh process: the builder's module is imported for its TFDS name (it registers the builder)."""
    result = run_module("data.stage", "--dataset=tfds:sklearn_breast_cancer", f"--data_dir={tmp_path}")
    assert result.returncode == 0 and "built into" in result.stdout, result.stderr[-2000:]


def test_staged_data_that_no_shipped_task_fits_is_staged_and_says_what_to_do(tmp_path, capsys):
    """Images with float labels (regression on images: no shipped task): the stage succeeds (exit 0), then says that
    no task fits and how to add one, instead of a traceback after the data was written."""
    images = np.random.default_rng(0).integers(0, 255, (10, 4, 4, 1)).astype(np.uint8)
    np.savez(tmp_path / "image_scores.npz", x_train=images[:6], y_train=np.linspace(0, 1, 6, dtype=np.float32),
             x_test=images[6:], y_test=np.linspace(0, 1, 4, dtype=np.float32))
    assert _stage("--name=image_scores", f"--data_dir={tmp_path}/tfds", f"--from_npz={tmp_path}/image_scores.npz") == 0
    out = capsys.readouterr().out
    assert f"image_scores: built into {tmp_path}/tfds" in out
    assert "The data is staged, but no shipped task fits it: DATASET='tfds:image_scores': no task fits" in out
    assert ('add a DatasetSpec(tfds_name="image_scores", ...) with a task for these features to DATASETS in '
            "data/registry.py") in out


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
    _write_images(f"{root}/images", {"train": 2, "test": 1})
    tf.io.write_file(f"{root}/images/test/red/big.png", tf.io.encode_png(np.zeros((9, 9, 3), np.uint8)))
    _write_images(f"{root}/modes", {"train": 2, "test": 1})
    tf.io.write_file(f"{root}/modes/train/red/gray.png", tf.io.encode_png(np.zeros((8, 8, 1), np.uint8)))
    _write_images(f"{root}/unseen", {"train": 2, "test": 1})
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
        "image shapes": ([f"--from_image_folder={root}/images"], ["big.png", "(9, 9, 3)", "Resize them to one size."]),
        "image modes": ([f"--from_image_folder={root}/modes"],
                        ["gray.png is (8, 8, 1)", ".png is (8, 8, 3). Convert them to one colour mode",
                         "(the first is grayscale, the second RGB; e.g. all RGB", ".convert('RGB')"]),
        "unknown dtype": ([f"--from_tfrecord=train={root}/*.tfrecord,test={root}/*.tfrecord",
                           "--features=x:float16[4],label:int64"], ["float16", "unknown dtype", "float32"]),
        "no test split": ([f"--from_csv=train={root}/train.csv"], ["'train'", "'test'"]),
        "NaN in a CSV feature": ([f"--from_csv=train={root}/nan.csv,test={root}/train.csv"],
                                 ["nan.csv", "split 'train'", "column 'b'", "row index 1 (line 3) is nan",
                                  "Drop those rows"]),
        "inf in a CSV target": ([f"--from_csv=train={root}/train.csv,test={root}/inf.csv"],
                                ["inf.csv", "split 'test'", "column 'label'", "row index 2 (line 4) is inf"]),
        "NaN in npz inputs": ([f"--from_npz={root}/nan.npz"],
                              ["nan.npz", "split 'test'", "array 'x_test'", "row index 2, position 1 is nan"]),
        "inf in npz targets": ([f"--from_npz={root}/inf.npz"],
                               ["split 'train'", "array 'y_train'", "row index 2 is -inf"]),
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


def test_the_readme_commands_parse_and_name_each_source():
    """The README's "Bring your own data" commands are valid command lines of data.stage, one per source."""
    readme = open(os.path.join(REPO_ROOT, "README.md")).read()
    commands = [shlex.split(line.strip(), comments=True) for line in readme.splitlines()
                if line.strip().startswith("python -m data.stage --name=")]
    sources = set()
    for command in commands:
        args = stage.parse_args(command[3:])
        sources |= {flag for flag in stage.SOURCES if getattr(args, flag)}
    assert sources == set(stage.SOURCES), commands


def test_text_labels_become_sorted_class_names_and_float_labels_a_target():
    from data.own_columns import columns

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
