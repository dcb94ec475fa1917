"""A CSV's columns in `python -m stage --from_csv` (stage/csv_header.py, csv_source.py): --id_column and
--drop_columns leave columns out of the features; the id column is recorded in the staged metadata, reaches the
export's serving_metadata.json and keys `python -m tools.predict`'s predictions (the issue's scenario: a breast-cancer
CSV with an `id` column, staged, trained, predicted); a column that looks like an id (a different whole number in
every row) is warned about, naming the flag; a repeated column name is refused; a text cell over 128 KiB stages;
TFDS's two misleading lines ("Variant folder ... has no dataset_info.json", "Downloading and preparing dataset
Unknown size") are not printed; and the suggested training run is sized to the train split.
"""

import csv
import logging
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

import train
from data.staged_spec import spec_from_metadata
from stage import cli as stage
from tools import predict

FEATURES = ["radius", "texture", "area"]


def _write_cancer_csv(path, rows: int = 80, seed: int = 0, with_id: bool = True) -> list[str]:
    """A breast-cancer-like CSV: `id` (large, distinct, unordered integers), three features, `diagnosis` (M/B from
    the features); returns the ids in file order."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((rows, 3))
    ids = [str(842302 + int(i)) for i in rng.permutation(rows * 97)[:rows]]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow((["id"] if with_id else []) + FEATURES + ["diagnosis"])
        for index, row in enumerate(values):
            label = "M" if row[0] + row[1] > 0 else "B"
            writer.writerow(([ids[index]] if with_id else []) + [f"{value * 10 + 20:.4f}" for value in row] + [label])
    return ids


def _stage_csv(tmp_path, name: str, *flags: str) -> int:
    return stage.main([f"--name={name}", f"--data_dir={tmp_path}/tfds", f"--from_csv={tmp_path}/bc.csv",
                       "--label=diagnosis", "--test_fraction=0.25", *flags])


def test_an_id_column_is_kept_out_of_the_features_and_keys_the_predictions(tmp_path, capsys):
    ids = _write_cancer_csv(tmp_path / "bc.csv")
    assert _stage_csv(tmp_path, "bc_ids", "--id_column=id") == 0
    task = spec_from_metadata("bc_ids", f"{tmp_path}/tfds").task
    assert task.feature_names == tuple(FEATURES) and task.num_features == 3 and task.id_column == "id"
    assert _stage_csv(tmp_path, "bc_all") == 0  # Negative control: without the flag the id is a feature.
    assert spec_from_metadata("bc_all", f"{tmp_path}/tfds").task.feature_names == ("id", *FEATURES)
    model_dir = tmp_path / "run"
    assert train.main(["train.py", "--gin_file=configs/experiments/breast_cancer_mlp.gin",
                       "--gin_param=DATASET='tfds:bc_ids'", f"--gin_param=DATA_DIR='{tmp_path}/tfds'",
                       "--gin_param=TRAIN_STEPS=20", "--gin_param=STEPS_PER_LOOP=10", "--gin_param=EVAL_EVERY=0",
                       "--gin_param=CHECKPOINT_EVERY=0", "--gin_param=cosine.warmup_steps=5",
                       "--gin_param=GLOBAL_BATCH_SIZE=16", "--gin_param=STRATEGY='default'",
                       f"--model_dir={model_dir}"]) == 0
    export = model_dir / "export" / "20"
    capsys.readouterr()
    assert predict.main([f"--export={export}", f"--input={tmp_path}/bc.csv", f"--output={tmp_path}/out.csv"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "out.csv")))
    assert list(rows[0])[0] == "id" and [row["id"] for row in rows] == ids  # Joinable back to the input by id.
    # Negative control: a CSV without the id column is keyed by line, as before.
    with open(tmp_path / "bc.csv") as source, open(tmp_path / "no_id.csv", "w", newline="") as target:
        writer = csv.writer(target)
        for row in csv.reader(source):
            writer.writerow(row[1:])
    assert predict.main([f"--export={export}", f"--input={tmp_path}/no_id.csv", f"--output={tmp_path}/out.csv"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "out.csv")))
    assert rows[0]["input"] == "line 2" and "id" not in rows[0]


def test_dropped_columns_are_left_out_and_a_column_like_an_id_is_warned_about(tmp_path, caplog):
    _write_cancer_csv(tmp_path / "bc.csv")
    with caplog.at_level(logging.WARNING, logger="stage.csv_source"):
        assert _stage_csv(tmp_path, "bc_warned") == 0
    warned = [record.getMessage() for record in caplog.records if "as an id does" in record.getMessage()]
    assert len(warned) == 1 and "column 'id'" in warned[0] and "--id_column=id" in warned[0], warned
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stage.csv_source"):
        assert _stage_csv(tmp_path, "bc_dropped", "--drop_columns=id,area") == 0
    assert not [record for record in caplog.records if "as an id does" in record.getMessage()]  # Control.
    assert spec_from_metadata("bc_dropped", f"{tmp_path}/tfds").task.feature_names == ("radius", "texture")
    assert stage.main(["--name=bc_dropped", f"--data_dir={tmp_path}/tfds", f"--from_csv={tmp_path}/bc.csv",
                       "--label=diagnosis", "--test_fraction=0.25", "--drop_columns=id"]) == 2  # Another source.


def test_a_repeated_column_and_unknown_columns_are_refused_naming_them(tmp_path, capsys):
    (tmp_path / "bc.csv").write_text("id,radius,radius,diagnosis\n" + "".join(f"{i},{i % 3},{i % 5},{'MB'[i % 2]}\n"
                                                                              for i in range(12)))
    assert _stage_csv(tmp_path, "bc_repeated") == 2
    error = capsys.readouterr().err
    assert "names the column(s) ['radius'] more than once" in error, error
    _write_cancer_csv(tmp_path / "bc.csv")
    for flags, words in ((["--id_column=ident"], "--id_column: 'ident' is not a column"),
                         (["--drop_columns=area,size"], "--drop_columns: 'size' is not a column"),
                         (["--id_column=diagnosis"], "is the --label column"),
                         (["--id_column=id", "--drop_columns=id"], "both name 'id'")):
        assert _stage_csv(tmp_path, "bc_refused", *flags) == 2, flags
        error = capsys.readouterr().err
        assert words in error and len(error.strip().splitlines()) == 1, (flags, error)
    assert not os.path.exists(tmp_path / "tfds" / "bc_refused")


def test_a_text_cell_over_128_kib_stages_and_tfds_local_noise_is_not_printed(tmp_path, capsys):
    """Python's csv module refuses fields over 131,072 characters by default; that was reported as "not a readable
    CSV ... export it as CSV in UTF-8". TFDS's two misleading lines are dropped, its other output kept."""
    long_text = "word " * 40_000  # 200,000 characters.
    with open(tmp_path / "texts.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        for index in range(12):
            writer.writerow([long_text if index == 3 else f"short text number {index}", "a" if index % 2 else "b"])
    assert stage.main(["--name=long_texts", f"--data_dir={tmp_path}/tfds", f"--from_csv={tmp_path}/texts.csv",
                       "--test_fraction=0.25"]) == 0
    out = capsys.readouterr().out
    texts = tfds.as_numpy(tfds.builder("long_texts", data_dir=f"{tmp_path}/tfds").as_dataset("train", batch_size=-1))
    assert max(len(text) for text in texts["text"]) == len(long_text.encode())
    assert "Variant folder" not in out and "Downloading and preparing" not in out, out
    assert "long_texts: built into" in out  # Control: the command's own output is there.


@pytest.mark.parametrize("examples, batch, steps, warmup", [(240, None, 200, 20), (1_281_167, None, 300_300, None),
                                                            (24, 16, 200, 20)])
def test_the_suggested_run_is_sized_to_the_data(examples, batch, steps, warmup):
    """mnist_cnn.gin trains 5,000 steps at batch 128 (10.7 epochs of MNIST): for 240 images that was ~2,700 epochs.
    The suggestion is 30 epochs at the suggested batch, at least 200 steps, rounded up to 100s, with a warm-up of at
    most a tenth of it; the config's batch only when the split is smaller."""
    params = dict(param.split("=", 1) for param in
                  stage._sized_run("configs/experiments/mnist_cnn.gin", examples).replace("--gin_param=", "").split())
    assert int(params["TRAIN_STEPS"]) == steps
    assert params.get("GLOBAL_BATCH_SIZE") == (str(batch) if batch else None)
    assert params.get("cosine.warmup_steps") == (str(warmup) if warmup else None)
    epochs = int(params["TRAIN_STEPS"]) * (batch or 128) / examples
    assert 30 <= epochs < (200 if examples < 1000 else 31), epochs  # Not ~2,700 epochs of a small split.
    assert stage._config_setting(os.path.join(stage.REPO_ROOT, "configs/experiments/mnist_cnn.gin"),
                                 "cosine.warmup_steps") == 200
