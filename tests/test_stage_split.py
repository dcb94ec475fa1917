"""One file split for you: `python -m stage --test_fraction=F --seed=S` on a single CSV, a single .npz (arrays
x, y) or an image folder of class folders (stage/split.py). The split is reproducible (a second staging gives
identical splits), stratified (each class's test share within one example of F, at least one example per class in
train), disjoint and complete (every source example in exactly one split); the fraction and seed are in the
dataset's description and in its staged_source.json fingerprint (another seed is another source). And the printed
next command for images names the CNN config and trains as printed.
"""

import json
import os
import shlex

import numpy as np
import pytest
import tensorflow_datasets as tfds

import forked_python
from helpers import REPO_ROOT, write_class_images
from stage import cli as stage

TINY = ["--gin_param=TRAIN_STEPS=30", "--gin_param=STEPS_PER_LOOP=10", "--gin_param=EVAL_EVERY=0",
        "--gin_param=CHECKPOINT_EVERY=0", "--gin_param=cosine.warmup_steps=5", "--gin_param=GLOBAL_BATCH_SIZE=16"]
FRACTION = 0.3


def _stage(*args: str) -> int:
    return stage.main(list(args))


def _splits(name: str, data_dir: str) -> dict:
    """{split: {feature: array}} of the staged dataset, in its stored order."""
    builder = tfds.builder(name, data_dir=data_dir)
    return {split: tfds.as_numpy(builder.as_dataset(split, batch_size=-1)) for split in ("train", "test")}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict:
    """A CSV and an .npz of the same 3-class rows (unbalanced: 50, 31 and 7 examples, each row distinct), and an
    image folder of class folders (red, blue)."""
    root = tmp_path_factory.mktemp("one_file")
    rng = np.random.default_rng(3)
    labels = rng.permutation(np.repeat([0, 1, 2], [50, 31, 7]))
    rows = np.column_stack([np.arange(len(labels)), rng.standard_normal((len(labels), 2))]).astype(np.float32)
    np.savez(root / "rows.npz", x=rows, y=labels)
    with open(root / "rows.csv", "w") as handle:
        handle.write("id,a,b,kind\n" + "".join(f"{int(r[0])},{r[1]!r},{r[2]!r},{'abc'[y]}\n"
                                               for r, y in zip(rows.tolist(), labels.tolist(), strict=True)))
    write_class_images(str(root / "pictures"), {"all": 20})
    return {"root": root, "rows": rows, "labels": labels, "data_dir": str(root / "tfds"),
            "npz": [f"--from_npz={root}/rows.npz"], "csv": [f"--from_csv={root}/rows.csv", "--label=kind"],
            "images": [f"--from_image_folder={root}/pictures/all"]}


@pytest.mark.parametrize("kind", ["npz", "csv", "images"])
def test_one_source_splits_reproducibly_stratified_disjoint_and_complete(sources, kind):
    data_dir = sources["data_dir"]
    for name in (f"{kind}_a", f"{kind}_b"):  # Two stagings of the same source into two datasets.
        assert _stage(f"--name={name}", f"--data_dir={data_dir}", *sources[kind], f"--test_fraction={FRACTION}",
                      "--seed=7") == 0
    first, second = _splits(f"{kind}_a", data_dir), _splits(f"{kind}_b", data_dir)
    for split in ("train", "test"):
        for key in first[split]:
            np.testing.assert_array_equal(first[split][key], second[split][key])
    key = "image" if kind == "images" else "features"
    if kind == "images":  # 20 red + 20 blue: 6 of each in test.
        source_labels = np.repeat([0, 1], 20)
    else:  # Rows are told apart by their id column: disjoint and complete.
        source_labels = sources["labels"]
        ids = {split: first[split][key][:, 0].astype(int) for split in first}
        assert not set(ids["train"]) & set(ids["test"])
        assert sorted([*ids["train"], *ids["test"]]) == list(range(len(source_labels)))
        for split, split_ids in ids.items():  # Each row kept its label.
            np.testing.assert_array_equal(first[split]["label"], sources["labels"][split_ids])
            np.testing.assert_allclose(first[split][key], sources["rows"][split_ids])
    assert len(first["train"]["label"]) + len(first["test"]["label"]) == len(source_labels)
    for label in np.unique(source_labels):
        count = int(np.sum(source_labels == label))
        in_test = int(np.sum(first["test"]["label"] == label))
        assert abs(in_test - FRACTION * count) <= 1 and in_test < count, (label, in_test, count)
    version_dir = os.path.join(data_dir, f"{kind}_a", "1.0.0")
    info = tfds.builder_from_directory(version_dir).info
    assert f"--test_fraction={FRACTION} --seed=7, stratified by class" in info.description, info.description
    fingerprint = json.load(open(os.path.join(version_dir, "staged_source.json")))
    assert fingerprint["settings"]["test_fraction"] == FRACTION and fingerprint["settings"]["seed"] == 7


def test_another_seed_is_another_split_and_another_source(sources, capsys):
    data_dir = sources["data_dir"]
    assert _stage("--name=seeded", f"--data_dir={data_dir}", *sources["npz"], "--test_fraction=0.3") == 0
    assert _stage("--name=seeded_1", f"--data_dir={data_dir}", *sources["npz"], "--test_fraction=0.3",
                  "--seed=1") == 0
    default, other = _splits("seeded", data_dir), _splits("seeded_1", data_dir)
    assert not np.array_equal(default["test"]["features"], other["test"]["features"])
    capsys.readouterr()
    assert _stage("--name=seeded", f"--data_dir={data_dir}", *sources["npz"], "--test_fraction=0.3", "--seed=0") == 0
    assert "already staged from this source" in capsys.readouterr().out  # The default seed is 0.
    assert _stage("--name=seeded", f"--data_dir={data_dir}", *sources["npz"], "--test_fraction=0.3", "--seed=1") == 2
    error = capsys.readouterr().err
    assert "--seed (0 then, 1 now)" in error and "--force" in error, error


def test_regression_targets_split_as_one_group(tmp_path):
    targets = np.linspace(0, 1, 40, dtype=np.float32)
    np.savez(tmp_path / "scores.npz", x=np.arange(40, dtype=np.float32)[:, None], y=targets)
    assert _stage("--name=scores", f"--data_dir={tmp_path}/tfds", f"--from_npz={tmp_path}/scores.npz",
                  "--test_fraction=0.25") == 0
    splits = _splits("scores", f"{tmp_path}/tfds")
    assert len(splits["test"]["target"]) == 10 and len(splits["train"]["target"]) == 30
    info = tfds.builder("scores", data_dir=f"{tmp_path}/tfds").info
    assert "--test_fraction=0.25 --seed=0 (30 train, 10 test examples)" in info.description


def test_sources_that_are_split_already_are_refused_with_a_fraction(tmp_path, capsys):
    """Exit 2 naming both: an .npz of x_train/x_test arrays, an image folder with train/test folders; and the
    negative control, the same folder staged by its own splits."""
    np.savez(tmp_path / "split.npz", x_train=np.zeros((4, 2)), y_train=np.zeros(4, int), x_test=np.zeros((2, 2)),
             y_test=np.zeros(2, int))
    write_class_images(str(tmp_path / "images"), {"train": 3, "test": 2})
    cases = {"npz": ([f"--from_npz={tmp_path}/split.npz"], "--npz_keys=INPUTS:LABELS"),
             "images": ([f"--from_image_folder={tmp_path}/images"], "has the split folder(s) ['test', 'train']")}
    for case, (arguments, word) in cases.items():
        assert _stage("--name=split_already", f"--data_dir={tmp_path}/tfds", *arguments, "--test_fraction=0.2") == 2
        error = capsys.readouterr().err.strip()
        assert len(error.splitlines()) == 1 and word in error and "--test_fraction" in error, (case, error)
    assert not os.path.exists(tmp_path / "tfds" / "split_already")
    assert _stage("--name=split_already", f"--data_dir={tmp_path}/tfds", f"--from_image_folder={tmp_path}/images") == 0
    capsys.readouterr()
    write_class_images(str(tmp_path / "flat"), {"all": 2})  # Class folders without --test_fraction: how to split.
    assert _stage("--name=flat", f"--data_dir={tmp_path}/tfds", f"--from_image_folder={tmp_path}/flat/all") == 2
    assert "pass --test_fraction=0.2 (say) to split them" in capsys.readouterr().err


def test_the_printed_command_for_images_names_the_cnn_and_trains(sources, tmp_path, capsys):
    """The command `python -m stage` prints for an image dataset, run as printed (shortened, its model_dir in
    tmp_path)."""
    assert _stage("--name=pictures", f"--data_dir={tmp_path}/tfds", *sources["images"], "--test_fraction=0.25") == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Train it: ")]
    command = shlex.split(line[len("Train it: "):])
    assert command[:3] == ["python", "train.py", "--gin_file=configs/experiments/mnist_cnn.gin"], command
    result = forked_python.run([*command[1:], *TINY, f"--model_dir={tmp_path / 'run'}"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "accuracy" in json.load(open(tmp_path / "run" / "metrics.json"))["eval"], result.stdout[-2000:]
