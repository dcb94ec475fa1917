"""`python -m tools.predict` (tools/predict.py, tools/prediction_inputs.py) on real exports of short runs of the shipped
tasks (tests/serving_runs.py): each kind of input (an image file, a folder of images, a CSV with and without a
header, a text file, a .npy, a Vertex AI .json request) gives the training-time model's predictions with class
names; each bad input exits 2 with one `error:` line, and those that need no image decoding are refused before
TensorFlow is imported."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from helpers import REPO_ROOT, run_module
from serving_runs import relative_difference
from tools import predict


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()  # Drop what came before (a first use of `served` prints the dataset's preparation).
    code = predict.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _csv_rows(text: str) -> list[dict]:
    return list(csv.DictReader(text.splitlines()))


def _write_png(path, image: np.ndarray) -> None:
    tf.io.write_file(str(path), tf.io.encode_png(image))


def _check_classified(rows: list[dict], expected: dict) -> None:
    """CSV rows (strings) against the training-time model's outputs: class ids, names, probability of the class."""
    assert [int(row["classes"]) for row in rows] == expected["classes"].tolist()
    assert [row["class_names"] for row in rows] == [name.decode() for name in expected["class_names"]]
    probabilities = np.array([float(row["probability"]) for row in rows])
    chosen = expected["probabilities"][np.arange(len(rows)), expected["classes"]]
    assert relative_difference(probabilities, chosen) <= 1e-5


def test_an_image_file_and_a_npy_batch(served, tmp_path, capsys):
    run = served("image")
    images = run.eval_inputs(5)["images"]
    expected = run.expected({"images": images})
    _write_png(tmp_path / "one.png", images[0])
    code, out, err = _run(capsys, f"--export={run.export_dir}", f"--input={tmp_path / 'one.png'}")
    assert code == 0, err
    rows = _csv_rows(out)
    assert rows[0]["input"] == str(tmp_path / "one.png")
    _check_classified(rows, {name: value[:1] for name, value in expected.items()})
    np.save(tmp_path / "batch.npy", images.astype(np.int64))  # Whole numbers in 0-255 convert to uint8.
    code, out, err = _run(capsys, f"--export={run.export_dir}", f"--input={tmp_path / 'batch.npy'}")
    assert code == 0, err
    _check_classified(_csv_rows(out), expected)


def test_a_folder_of_images_through_the_command_line(served, tmp_path):
    run = served("image")
    images = run.eval_inputs(3)["images"]
    os.makedirs(tmp_path / "digits" / "class_b")  # A sub-folder, as in a folder staged by class: read too.
    for index, image in enumerate(images):
        _write_png(tmp_path / "digits" / ("class_b" if index == 2 else "") / f"{index}.png", image)
    (tmp_path / "digits" / "notes.txt").write_text("not an image: skipped by its suffix")
    result = run_module("tools.predict", f"--export={run.export_dir}", f"--input={tmp_path / 'digits'}",
                        f"--output={tmp_path / 'out.csv'}", timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = _csv_rows((tmp_path / "out.csv").read_text())
    assert [row["input"] for row in rows] == ["0.png", "1.png", "class_b/2.png"]
    _check_classified(rows, run.expected({"images": images}))


def test_a_csv_with_a_header_is_read_by_column_name(served, tmp_path, capsys):
    """Columns in another order, plus one the model does not take (the label), as a user's CSV would have them."""
    run = served("tabular")
    features = run.eval_inputs(6)["features"]
    names = list(run.trainer.task.feature_names)
    order = names[::-1]
    with open(tmp_path / "rows.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["label", *order])
        for row in features:
            by_name = dict(zip(names, row.tolist(), strict=True))
            writer.writerow(["?", *(repr(by_name[name]) for name in order)])
    code, out, err = _run(capsys, f"--export={run.export_dir}", f"--input={tmp_path / 'rows.csv'}",
                          f"--output={tmp_path / 'out.jsonl'}")
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    expected = run.expected({"features": features})
    assert [record["input"] for record in records] == [f"line {number}" for number in range(2, 8)]
    assert relative_difference(np.array([record["probabilities"] for record in records]),
                               expected["probabilities"]) <= 1e-5
    assert relative_difference(np.array([record["logits"] for record in records]), expected["logits"]) <= 1e-5
    assert [record["class_names"] for record in records] == [name.decode() for name in expected["class_names"]]


def test_a_csv_without_a_header_and_a_vertex_request(served, tmp_path, capsys):
    run = served("regression")
    features = run.eval_inputs(4)["features"]
    (tmp_path / "rows.csv").write_text("\n".join(",".join(repr(value) for value in row.tolist()) for row in features))
    code, out, err = _run(capsys, f"--export={run.export_dir}", f"--input={tmp_path / 'rows.csv'}")
    assert code == 0, err
    rows = _csv_rows(out)
    assert list(rows[0]) == ["input", "predictions"]
    got = np.array([float(row["predictions"]) for row in rows])
    assert relative_difference(got, run.expected({"features": features})["predictions"]) <= 1e-5
    request = os.path.join(run.export_dir, "assets.extra", "example_request.json")
    code, out, err = _run(capsys, f"--export={run.export_dir}", f"--input={request}")
    assert code == 0, err
    got = np.array([float(row["predictions"]) for row in _csv_rows(out)])
    assert relative_difference(got, run.expected({"features": features[:2]})["predictions"]) <= 1e-5


def test_a_text_file_of_lines_through_the_command_line(served, tmp_path):
    run = served("text")
    texts = [text.decode() for text in run.eval_inputs(4)["text"]]
    (tmp_path / "reviews.txt").write_text("\n\n".join(texts) + "\n")  # Blank lines between them are skipped.
    result = run_module("tools.predict", f"--export={run.export_dir}", f"--input={tmp_path / 'reviews.txt'}",
                        f"--output={tmp_path / 'out.jsonl'}", timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    expected = run.expected({"text": np.array([text.encode() for text in texts], dtype=object)})
    assert [record["input"] for record in records] == texts
    assert [record["class_names"] for record in records] == [name.decode() for name in expected["class_names"]]
    assert relative_difference(np.array([record["probabilities"] for record in records]),
                               expected["probabilities"]) <= 1e-5


def _bad_inputs(served, folder) -> dict:
    """{case: (export, input file, the words its error must say, whether TensorFlow is needed to find it)}."""
    image, tabular, text = served("image"), served("tabular"), served("text")
    folder.mkdir(exist_ok=True)
    np.save(folder / "nine.npy", np.zeros([2, 9, 9, 1], np.uint8))
    np.save(folder / "pixels.npy", np.full([2, 8, 8, 1], 2.5))
    names = list(tabular.trainer.task.feature_names)
    (folder / "missing.csv").write_text(",".join(names[1:]) + "\n" + ",".join(["1"] * 29) + "\n")
    (folder / "word.csv").write_text(",".join(names) + "\n" + ",".join(["1"] * 29 + ["big"]) + "\n")
    (folder / "short.csv").write_text(",".join(["1"] * 29) + "\n")
    (folder / "empty.txt").write_text("\n  \n")
    (folder / "garbage.png").write_bytes(b"\x89PNG not really")
    _write_png(folder / "big.png", np.zeros([10, 10, 1], np.uint8))
    (folder / "request.json").write_text(json.dumps({"instances": [{"texts": "a"}]}))
    row = tabular.eval_inputs(1)["features"][0]
    (folder / "nan.csv").write_text(",".join(names) + "\n" + ",".join(map(repr, row.tolist())) + "\n" +
                                    ",".join(["1", "nan"] + ["1"] * 28) + "\n")
    (folder / "inf.csv").write_text(",".join(["1"] * 29 + ["-inf"]) + "\n")
    infinite = np.ones([2, 30], np.float32)
    infinite[1, 4] = np.inf
    np.save(folder / "inf.npy", infinite)
    (folder / "nan.json").write_text('{"instances": [{"features": [' + ", ".join(["1"] * 29 + ["NaN"]) + "]}]}")
    return {
        "CSV with a NaN": (tabular, "nan.csv", "line 3, column 'mean texture': 'nan' is not a finite number", False),
        "CSV with an infinity": (tabular, "inf.csv", f"line 1, column {names[29]!r}: '-inf' is not a finite", False),
        "npy with an infinity": (tabular, "inf.npy", f"'features' row 1, column {names[4]!r} is inf", False),
        "request with a NaN": (tabular, "nan.json", f"'features' row 0, column {names[29]!r} is nan", False),
        "npy of the wrong shape": (image, "nine.npy", "must have shape (8, 8, 1); got (9, 9, 1)", False),
        "npy of fractional pixels": (image, "pixels.npy", "whole numbers from 0 to 255", False),
        "CSV without a feature column": (tabular, "missing.csv", "lacks the feature column(s) ['mean radius']", False),
        "CSV with a word": (tabular, "word.csv", "'big' is not a number", False),
        "CSV row of 29 values": (tabular, "short.csv", "29 fields, expected 30", False),
        "empty text file": (text, "empty.txt", "holds no examples", False),
        "folder for a text export": (text, ".", "is a folder", False),
        "request without the input": (text, "request.json", "has no 'text'", False),
        "unreadable image": (image, "garbage.png", "is not an image TensorFlow can decode", True),
        "image of another size": (image, "big.png", "is 10x10x1 (height x width x channels); this export takes 8x8x1",
                                  True),
    }


def test_each_bad_input_exits_2_with_one_line(served, tmp_path, capsys):
    for case, (run, name, words, _) in _bad_inputs(served, tmp_path / "bad").items():
        code, out, err = _run(capsys, f"--export={run.export_dir}", f"--input={tmp_path / 'bad' / name}")
        assert code == 2 and out == "", case
        assert len(err.splitlines()) == 1 and err.startswith("error: ") and words in err, (case, err)
    run = served("image")
    for argv, words in ((["--export=" + str(tmp_path), "--input=x.png"], "is not an export of this template"),
                        ([f"--export={run.export_dir}", "--input=x.png", "--output=out.txt"], "must end in .csv"),
                        ([f"--export={run.export_dir}", f"--input={tmp_path / 'none.png'}"], "no such file"),
                        (["--export=gs://bucket/export/1", "--input=x.png"], "predict reads a local export")):
        code, out, err = _run(capsys, *argv)
        assert code == 2 and len(err.splitlines()) == 1 and words in err, (argv, err)


def test_bad_flags_and_files_are_refused_before_tensorflow_is_imported(served, tmp_path):
    """Every bad input that needs no image decoding, and bad flags, in a fresh process that checks sys.modules after
    each; a control case shows the check sees an import (a good CSV runs the model)."""
    cases = [[f"--export={run.export_dir}", f"--input={tmp_path / 'bad' / name}"] for run, name, _, needs_tensorflow
             in _bad_inputs(served, tmp_path / "bad").values() if not needs_tensorflow]
    cases += [[f"--export={served('image').export_dir}", "--input=x.png", "--output=out.txt"],
              [f"--export={tmp_path}", "--input=x.png"]]
    good = tmp_path / "good.csv"
    good.write_text(",".join(["1"] * 30) + "\n")
    cases.append([f"--export={served('tabular').export_dir}", f"--input={good}"])
    script = ("import json, sys\nfrom tools import predict\nresults = []\n"
              "for argv in json.loads(sys.argv[1]):\n"
              "    results.append([predict.main(argv), 'tensorflow' in sys.modules])\n"
              "print(json.dumps(results))\n")
    result = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], capture_output=True, text=True,
                            cwd=REPO_ROOT, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    assert results[:-1] == [[2, False]] * (len(cases) - 1), result.stderr
    assert results[-1] == [0, True]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_the_output_file_has_one_record_per_example(served, tmp_path, capsys, suffix):
    run = served("image")
    np.save(tmp_path / "batch.npy", run.eval_inputs(3)["images"])
    output = tmp_path / f"out{suffix}"
    code, out, err = _run(capsys, f"--export={run.export_dir}", f"--input={tmp_path / 'batch.npy'}",
                          f"--output={output}")
    assert code == 0 and out == "" and "Wrote 3 predictions" in err
    lines = output.read_text().splitlines()
    assert len(lines) == (4 if suffix == ".csv" else 3)
