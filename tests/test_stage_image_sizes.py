"""Images of any size: `python -m stage --from_image_folder=DIR --image_size=H,W --resize=pad|crop|stretch
[--channels=1|3]` stages a folder of mixed sizes (and colour modes) at H x W, with exactly the uint8 pixels of
tasks/image_resize.resize_image applied to each source file; the resize is recorded in the image feature's TFDS
documentation and read back into ImageClassification.serving_resize, so the export takes uint8 images of any size and
resizes them in its graph with the same function: a source picture of another size gives the same logits as its
staged (resized) copy (tolerance 1e-6; measured: equal), in tf.saved_model.load, `saved_model_cli run` and
`python -m tools.predict` on a folder of mixed sizes.
Negative controls: mixed sizes without --image_size (and mixed colour modes without --channels) exit 2 naming the
flag; the three modes give different pixels on a non-square image, and so different logits in the export.
"""

import json
import os
import shlex
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import forked_python
from data.staged_spec import spec_from_metadata
from helpers import REPO_ROOT
from stage import cli as stage
from stage.images import list_images
from tasks.image_resize import MODES, convert_channels, resize_image

SIZE = (32, 32)
SHORT = ["--gin_param=TRAIN_STEPS=40", "--gin_param=STEPS_PER_LOOP=20", "--gin_param=EVAL_EVERY=0",
         "--gin_param=CHECKPOINT_EVERY=0", "--gin_param=cosine.warmup_steps=10", "--gin_param=GLOBAL_BATCH_SIZE=8",
         "--gin_param=experiment.export_tflite=True"]
LOGIT_TOLERANCE = 1e-6


def _write_folder(root, counts: dict, gray_every: int = 0, seed: int = 0) -> None:
    """root/SPLIT/{red,blue}/*.png of random sizes 20-40 px (RGB; every `gray_every`-th one grayscale)."""
    rng = np.random.default_rng(seed)
    for split, count in counts.items():
        for channel, name in ((0, "red"), (2, "blue")):
            os.makedirs(root / split / name)
            for index in range(count):
                height, width = (int(size) for size in rng.integers(20, 41, 2))
                image = rng.integers(0, 90, (height, width, 3)).astype(np.uint8)
                image[..., channel] += 150
                if gray_every and index % gray_every == 0:
                    image = image[..., :1]
                tf.io.write_file(str(root / split / name / f"{index}.png"), tf.io.encode_png(image))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    _write_folder(root / "mixed", {"train": 12, "test": 4})
    _write_folder(root / "modes", {"train": 4, "test": 2}, gray_every=2, seed=1)
    return root


def _decoded(path: str) -> np.ndarray:
    return tf.io.decode_image(tf.io.read_file(path), expand_animations=False).numpy()


def _stored_and_expected(source, data_dir, name, mode, channels=None):
    """The staged test images and resize_image of each source file, in the staging's order."""
    builder = tfds.builder(name, data_dir=data_dir)
    stored = tfds.as_numpy(builder.as_dataset("test", batch_size=-1))["image"]
    expected = []
    for files in list_images(str(source))["test"].values():
        for path in files:
            image = _decoded(path) if channels is None else convert_channels(_decoded(path), channels)
            expected.append(resize_image(image, SIZE, mode).numpy())
    return stored, np.stack(expected)


@pytest.mark.parametrize("mode", MODES)
def test_each_resize_mode_stages_mixed_sizes_with_the_resized_pixels(folders, tmp_path, mode):
    data_dir = str(tmp_path / "tfds")
    assert stage.main([f"--name=mixed_{mode}", f"--data_dir={data_dir}", f"--from_image_folder={folders}/mixed",
                       "--image_size=32,32", f"--resize={mode}"]) == 0
    stored, expected = _stored_and_expected(folders / "mixed", data_dir, f"mixed_{mode}", mode)
    assert stored.shape == (8, 32, 32, 3) and stored.dtype == np.uint8
    np.testing.assert_array_equal(stored, expected)  # Exact.
    task = spec_from_metadata(f"mixed_{mode}", data_dir).task
    assert task.serving_resize == (32, 32, mode) and task.image_shape == (32, 32, 3)
    assert task.serving_signature()["images"].shape.as_list() == [None, None, None, 3]


def test_the_modes_give_different_pixels_and_an_image_of_the_size_is_unchanged(folders):
    """Negative control: a serving resize other than staging's would not reproduce the staged pixels."""
    source = _decoded(str(folders / "mixed" / "train" / "red" / "0.png"))
    assert source.shape[0] != source.shape[1], source.shape
    resized = {mode: resize_image(source, SIZE, mode).numpy() for mode in MODES}
    for first, second in (("pad", "crop"), ("pad", "stretch"), ("crop", "stretch")):
        assert (resized[first] != resized[second]).any(), (first, second)
    for mode, image in resized.items():
        np.testing.assert_array_equal(resize_image(image, SIZE, mode).numpy(), image)
    # resize_image resizes float32 pixels and clips with maximum/minimum (so LiteRT converts it): the same pixels as
    # the uint8 resize and saturate_cast that staged datasets before it.
    before = tf.saturate_cast(tf.round(tf.image.resize(source, SIZE, method="bilinear")), tf.uint8).numpy()
    np.testing.assert_array_equal(resized["stretch"], before)


def test_mixed_sizes_or_modes_without_the_flags_are_exit_2_naming_them(folders, tmp_path, capsys):
    data_dir = str(tmp_path / "tfds")
    assert stage.main(["--name=refused", f"--data_dir={data_dir}", f"--from_image_folder={folders}/mixed"]) == 2
    error = capsys.readouterr().err
    assert "Images of different shapes" in error and "--image_size=H,W" in error, error
    args = ["--name=modes", f"--data_dir={data_dir}", f"--from_image_folder={folders}/modes", "--image_size=32,32"]
    assert stage.main(args) == 2
    error = capsys.readouterr().err
    assert "Convert them to one colour mode" in error and "--channels=3" in error, error
    assert not os.path.exists(tmp_path / "tfds" / "modes")
    assert stage.main([*args, "--channels=1"]) == 0  # Control: converted, the same folder stages.
    stored, expected = _stored_and_expected(folders / "modes", data_dir, "modes", "pad", channels=1)
    assert stored.shape == (4, 32, 32, 1)
    np.testing.assert_array_equal(stored, expected)


def test_another_size_is_another_source(folders, tmp_path, capsys):
    args = ["--name=sized", f"--data_dir={tmp_path}/tfds", f"--from_image_folder={folders}/mixed"]
    assert stage.main([*args, "--image_size=32,32"]) == 0
    assert stage.main([*args, "--image_size=32,32", "--resize=pad"]) == 0  # The default, said: the same source.
    assert "already staged from this source" in capsys.readouterr().out
    assert stage.main([*args, "--image_size=24,24"]) == 2
    error = capsys.readouterr().err
    assert "--image_size ('32,32' then, '24,24' now)" in error, error
    assert stage.main([*args, "--image_size=32,32", "--resize=crop"]) == 2
    assert "--resize ('pad' then, 'crop' now)" in capsys.readouterr().err


@pytest.mark.slow
def test_the_export_serves_images_of_any_size_as_staging_resized_them(folders, tmp_path, capsys):
    data_dir, model_dir = str(tmp_path / "tfds"), str(tmp_path / "run")
    assert stage.main(["--name=served", f"--data_dir={data_dir}", f"--from_image_folder={folders}/mixed",
                       "--image_size=32,32", "--resize=pad"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Train it: ")]
    command = [arg for arg in shlex.split(line[len("Train it: "):]) if not arg.startswith("--model_dir=")]
    assert command[:3] == ["python", "train.py", "--gin_file=configs/experiments/mnist_cnn.gin"], command
    result = forked_python.run([*command[1:], *SHORT, f"--model_dir={model_dir}"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    export = os.path.join(model_dir, "export", "40")
    # The any-size graph converts to builtin LiteRT ops (it did not: "no builtin op for ClipByValue, ResizeBilinear").
    assert "model.tflite not written" not in result.stdout + result.stderr
    assert os.path.isfile(os.path.join(export, "model.tflite"))
    described = json.load(open(os.path.join(export, "assets.extra", "serving_metadata.json")))
    assert described["resize"] == {"image_size": [32, 32], "mode": "pad"}
    assert described["inputs"]["images"]["shape"] == [None, None, None, 3]
    serve = tf.saved_model.load(export).signatures["serving_default"]
    path = str(folders / "mixed" / "test" / "blue" / "1.png")
    source = _decoded(path)
    assert source.shape[:2] != SIZE
    logits = {name: serve(images=tf.constant(image[None]))["logits"].numpy()
              for name, image in (("source", source), ("staged", resize_image(source, SIZE, "pad").numpy()),
                                  ("crop", resize_image(source, SIZE, "crop").numpy()))}
    np.testing.assert_allclose(logits["source"], logits["staged"], rtol=0, atol=LOGIT_TOLERANCE)
    assert np.abs(logits["source"] - logits["crop"]).max() > 1e-3  # Negative control: another mode differs.
    np.save(tmp_path / "images.npy", source[None])
    cli = subprocess.run([os.path.join(os.path.dirname(sys.executable), "saved_model_cli"), "run", "--dir", export,
                          "--tag_set", "serve", "--signature_def", "serving_default", "--inputs",
                          f"images={tmp_path / 'images.npy'}", "--outdir", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=180)
    assert cli.returncode == 0, cli.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "out" / "logits.npy"), logits["staged"], rtol=0,
                               atol=LOGIT_TOLERANCE)
    from tools import predict

    assert predict.main([f"--export={export}", f"--input={folders}/mixed/test/blue"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[0].startswith("input,class_names") and len(rows) == 5, rows
    assert all(",blue," in row for row in rows[1:]), rows


def test_an_any_size_export_converts_to_litert_at_any_size_or_at_a_fixed_size(folders, tmp_path):
    """model.tflite of an export that resizes (pad, the mode whose graph is hardest to convert): it was not written
    ("no builtin op for ClipByValue, ResizeBilinear"). Now it takes images of any size, or, with
    experiment.export_tflite_image_size, of that one size (what accelerator delegates need), and answers as the
    SavedModel on the same pictures: logits within 1e-3 relative (measured 2e-5 to 1.1e-4 on 2 CPU cores: LiteRT's
    bilinear resize rounds a few pixels to the other side of .5); labels.txt names the classes."""
    import keras

    from helpers import litert_runner
    from models.cnn import cnn
    from serving import metadata
    from serving_runs import relative_difference
    from training.run_directory.export import export_saved_model

    data_dir = str(tmp_path / "tfds")
    assert stage.main(["--name=lite", f"--data_dir={data_dir}", f"--from_image_folder={folders}/mixed",
                       "--image_size=32,32"]) == 0
    task = spec_from_metadata("lite", data_dir).task
    task = type(task)(**{**task.__dict__, "class_names": ("blue", "red")})
    keras.utils.set_random_seed(0)
    model = cnn(task.image_shape, task.num_classes)
    pictures = [_decoded(path) for path in sorted(list_images(str(folders / "mixed"))["test"]["blue"])[:3]]
    any_size = export_saved_model(model, task, str(tmp_path / "any" / "1"), with_tflite=True)
    fixed = export_saved_model(model, task, str(tmp_path / "fixed" / "1"), with_tflite=True,
                               tflite_image_size=(40, 48))
    assert metadata.read_local(any_size)["tflite"]["inputs"] == {"images": [None, None, None, 3]}
    assert metadata.read_local(fixed)["tflite"]["inputs"] == {"images": [None, 40, 48, 3]}
    assert open(os.path.join(fixed, "labels.txt")).read() == "blue\nred\n"
    serve = tf.saved_model.load(any_size).signatures["serving_default"]
    runner = litert_runner(os.path.join(any_size, "model.tflite"))
    at_fixed_size = np.stack([tf.image.resize(picture, (40, 48)).numpy().round().astype(np.uint8)
                              for picture in pictures])
    cases = [(runner, picture[None]) for picture in pictures]  # Each at its own size (they differ).
    cases.append((litert_runner(os.path.join(fixed, "model.tflite")), at_fixed_size))
    assert len({picture.shape for picture in pictures}) > 1
    for run, images in cases:
        expected = serve(images=tf.constant(images))["logits"].numpy()
        assert relative_difference(run(images=images)["logits"], expected) <= 1e-3
    with warnings.catch_warnings():  # The input's shape as the file declares it (-1: any), beside its contrast.
        warnings.simplefilter("ignore")
        declared = [tf.lite.Interpreter(model_path=os.path.join(export, "model.tflite")).get_input_details()[0][
            "shape_signature"].tolist() for export in (any_size, fixed)]
    assert declared == [[-1, -1, -1, 3], [-1, 40, 48, 3]]


def test_export_tflite_image_size_must_be_a_height_and_width(small_config):
    from common.errors import ConfigError

    assert small_config().export_tflite_image_size is None  # The export's own input size by default.
    assert small_config(export_tflite_image_size=[40, 48]).export_tflite_image_size == (40, 48)
    for bad in ((32,), (0, 32), "224", (32.0, 32)):
        with pytest.raises(ConfigError, match=r"experiment.export_tflite_image_size=.* must be None or \(height, "
                                              r"width\).*--gin_param=\"experiment.export_tflite_image_size=\(224, "
                                              r"224\)\""):
            small_config(export_tflite_image_size=bad)
