"""What `python -m data.stage` refuses that it used to crash on or stage broken (exit 2, one `error:` line naming the
file or value and the fix, nothing written), and a resume refused on other staged data than the checkpoint's run
trained on (data/own_fingerprint.py's fingerprint in run_identity.json).
"""

import os

import numpy as np

from data import stage
from helpers import write_class_images


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
    from data.own_columns import columns

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
