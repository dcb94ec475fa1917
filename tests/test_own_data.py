"""Bring your own data: each source (.npz arrays, CSV, TFRecord + feature spec, image folder) staged with
`python -m stage --from_...` becomes a TFDS dataset whose metadata holds its features and split sizes, and trains
by name (`DATASET='tfds:NAME'`) through train.py, locally and from gs:// (loopback server); --force rebuilds, a second
stage without it writes nothing; a staged tabular dataset's export serves raw rows; the printed training command runs.
What `python -m stage` refuses (bad inputs, another source under a staged name) is tested in test_own_data_checks.py.

The data are generated here, learnable from raw values on very different scales (so the task's standardisation
matters); one data_dir per module holds every staged dataset.
"""

import json
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from helpers import REPO_ROOT, run_module, run_train_py, write_class_images
from stage import cli as stage

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


def _stage_flags(root) -> dict:
    """The stage source flags of each staged dataset (files written by the `staged` fixture under root)."""
    return {
        "own_npz": [f"--from_npz={root}/rows.npz"],
        "own_csv": [f"--from_csv=train={root}/train.csv,test={root}/test.csv", "--label=price"],
        "own_tfrecord": [f"--from_tfrecord=train={root}/train-*.tfrecord,test={root}/test-*.tfrecord",
                         "--features=x:float32[4],y:int64", "--label=y"],
        "own_images": [f"--from_image_folder={root}/images"],
    }


# Per staged dataset: the shipped experiment to train it with, the eval metric and the bound it must reach.
TRAINING = {
    "own_npz": (TABULAR, "accuracy", 0.85),
    "own_tfrecord": (TABULAR, "accuracy", 0.85),
    "own_csv": (["--gin_file=configs/experiments/synthetic_housing_mlp.gin"], "mean_absolute_error", 1.0),
    "own_images": (["--gin_file=configs/experiments/digits_mlp.gin"], "accuracy", 0.9),
}


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> dict:
    """One data_dir with four staged datasets (one per source) and the raw inputs they came from."""
    root = tmp_path_factory.mktemp("own")
    data_dir, inputs = str(root / "tfds"), {}
    x_train, y_train = _rows(400, 0)
    x_test, y_test = _rows(100, 1)
    inputs["npz"] = str(root / "rows.npz")
    np.savez(inputs["npz"], x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
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
    write_class_images(str(root / "images"), {"train": 40, "test": 10})
    for name, flags in _stage_flags(root).items():
        assert _stage(f"--name={name}", f"--data_dir={data_dir}", *flags) == 0, name
    return {"data_dir": data_dir, "root": root, "inputs": inputs, "test": (x_test, y_test)}


def _train_by_name(name: str, data_dir: str, model_dir: str) -> None:
    """Trains the staged dataset `name` by DATASET='tfds:NAME' through train.py and checks its eval metric."""
    config, metric, bound = TRAINING[name]
    result = run_train_py(*config, *TINY, f"--gin_param=DATASET='tfds:{name}'", f"--gin_param=DATA_DIR='{data_dir}'",
                          f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    value = json.load(tf.io.gfile.GFile(f"{model_dir}/metrics.json"))["eval"][metric]
    assert value >= bound if metric == "accuracy" else value <= bound, result.stdout[-1500:]


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


@pytest.mark.parametrize("name", sorted(TRAINING))
def test_each_staged_source_trains_by_name(staged, tmp_path, name):
    model_dir = str(tmp_path / "run")
    _train_by_name(name, staged["data_dir"], model_dir)
    if name == "own_npz":  # The export serves raw rows (not standardised ones) and standardises them itself.
        served = tf.saved_model.load(f"{model_dir}/export/60").signatures["serving_default"]
        rows, labels = staged["test"]
        outputs = served(features=tf.constant(rows))
        assert np.mean(outputs["classes"].numpy() == labels) >= 0.85
        assert set(outputs["class_names"].numpy().tolist()) <= {b"0", b"1"}
    if name == "own_csv":  # The CSV's column names are kept: the file it was staged from predicts as it is.
        _predict_from_the_staged_csv(staged, model_dir, tmp_path)


def _predict_from_the_staged_csv(staged, model_dir: str, tmp_path) -> None:
    """tools.predict on the staged test.csv (header a,b,c,d,price; the label column ignored) gives what the signature
    gives on its feature rows (1e-5 relative); serving_metadata.json names the columns. The negative control: a
    header without those names is refused."""
    from tools import predict

    export = f"{model_dir}/export/60"
    metadata = json.load(open(f"{export}/assets.extra/serving_metadata.json"))
    assert metadata["feature_names"] == ["a", "b", "c", "d"], metadata
    out = tmp_path / "predictions.jsonl"
    assert predict.main([f"--export={export}", f"--input={staged['root']}/test.csv", f"--output={out}"]) == 0
    predicted = np.array([json.loads(line)["predictions"] for line in out.read_text().splitlines()]).reshape(-1)
    rows = np.loadtxt(staged["root"] / "test.csv", delimiter=",", skiprows=1, dtype=np.float32)[:, :4]
    served = tf.saved_model.load(export).signatures["serving_default"]
    expected = served(features=tf.constant(rows))["predictions"].numpy().reshape(-1)
    assert len(predicted) == 100 and np.max(np.abs(predicted - expected) / np.maximum(np.abs(expected), 1e-6)) <= 1e-5
    (tmp_path / "renamed.csv").write_text("w,x,y,z,price\n1,2,3,4,5\n")
    assert predict.main([f"--export={export}", f"--input={tmp_path / 'renamed.csv'}"]) == 2


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


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRAINING))
def test_each_source_stages_into_gcs_and_trains_from_there(staged, gcs, gcs_bucket, tmp_path, name):
    """Staged into gs:// (loopback server), the dataset holds the same examples as the local staging, and trains
    by name from there with the model_dir on gs:// too."""
    data_dir = f"gs://{gcs_bucket}/tensorflow_datasets"
    assert _stage(f"--name={name}", f"--data_dir={data_dir}", *_stage_flags(staged["root"])[name]) == 0
    names = gcs.object_names(gcs_bucket, f"tensorflow_datasets/{name}/1.0.0/")
    assert any(object_name.endswith("dataset_info.json") for object_name in names), names
    for split in ("train", "test"):
        local, remote = (tfds.as_numpy(tfds.builder(name, data_dir=where).as_dataset(split, batch_size=-1))
                         for where in (staged["data_dir"], data_dir))
        assert local.keys() == remote.keys()
        for key in local:
            np.testing.assert_array_equal(local[key], remote[key], err_msg=f"{name} {split} {key}")
    _train_by_name(name, data_dir, f"gs://{gcs_bucket}/runs/{name}")


@pytest.mark.slow
def test_staging_into_gcs_prints_the_command_and_a_second_stage_rewrites_nothing(staged, gcs, gcs_bucket):
    data_dir = f"gs://{gcs_bucket}/tensorflow_datasets"
    result = run_module("stage", "--name=own_npz", f"--data_dir={data_dir}",
                        f"--from_npz={staged['inputs']['npz']}")
    assert result.returncode == 0 and "own_npz: built into" in result.stdout, result.stderr[-3000:]
    assert ("--gin_file=configs/experiments/breast_cancer_mlp.gin --gin_param=\"DATASET='tfds:own_npz'\"" in
            result.stdout and "TabularClassification(num_features=4)" in result.stdout), result.stdout
    info = "tensorflow_datasets/own_npz/1.0.0/dataset_info.json"
    generation = gcs.client().bucket(gcs_bucket).get_blob(info).generation
    assert _stage("--name=own_npz", f"--data_dir={data_dir}", f"--from_npz={staged['inputs']['npz']}") == 0
    assert gcs.client().bucket(gcs_bucket).get_blob(info).generation == generation  # Nothing rewritten.
    assert _stage("--name=own_npz", f"--data_dir={data_dir}", f"--from_npz={staged['inputs']['npz']}", "--force") == 0
    assert gcs.client().bucket(gcs_bucket).get_blob(info).generation != generation  # Deleted and stored anew.
    assert tfds.builder("own_npz", data_dir=data_dir).info.splits["train"].num_examples == 400


def test_the_printed_training_command_runs_for_three_classes(tmp_path, capsys):
    """The command `python -m stage` prints, copied verbatim (only shortened, and its model_dir moved to tmp_path),
    trains a 3-class tabular dataset: the starting config's two-class metrics (AUC, precision, recall) are replaced."""
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
    assert "python -m stage --name=not_staged_here" in result.stderr and "--from_npz" in result.stderr


def test_a_bundled_builder_stages_by_its_tfds_name(tmp_path):
    """In a fresh process: the builder's module is imported for its TFDS name (it registers the builder)."""
    result = run_module("stage", "--dataset=tfds:sklearn_breast_cancer", f"--data_dir={tmp_path}", process=True)
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


def test_the_readme_commands_parse_and_name_each_source():
    """docs/data.md's "Bring your own data" commands are valid command lines of `python -m stage`, one per source."""
    readme = open(os.path.join(REPO_ROOT, "docs", "data.md")).read()
    commands = [shlex.split(line.strip(), comments=True) for line in readme.splitlines()
                if line.strip().startswith("python -m stage --name=")]
    sources = set()
    for command in commands:
        args = stage.parse_args(command[3:])
        sources |= {flag for flag in stage.SOURCES if getattr(args, flag)}
    assert sources == set(stage.SOURCES), commands
