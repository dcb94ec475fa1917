"""Exports that real servers load (training/run_directory/export.py, serving/): for every shipped task, a short real
run's
export/<step>/ (and the tabular run's export/best/) served by the graph-mode loader that TF Serving, Vertex AI and
`saved_model_cli run` use, and by tf.saved_model.load, returns the training-time model's outputs on the same raw
inputs (<= 1e-5; class ids and names equal). Its TF Serving warmup file parses and each request runs through the
signature; the Vertex AI request examples of docs/serving.md and the export's example_request.json run through the
signature converted as TF Serving's REST API converts them; model.tflite (image, tabular, regression) matches the
SavedModel in LiteRT's interpreter, labels.txt names its classes, and the text task says in one line why it has
none. What an export refuses (non-finite features) and its empty-batch answer: tests/test_serving_inputs.py.
Negative control: the export as it was written before (a tf.Module holding the Keras model, tf.saved_model.save)
fails in saved_model_cli.
No TF Serving binary or Docker engine exists here: the graph-mode loader is what is tested of them.
"""

import json
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import REPO_ROOT, litert_runner, run_train_py
from serving import metadata, requests, warmup
from serving_runs import (
    STEPS,
    assert_same_outputs,
    cli_outputs,
    loaded_outputs,
    relative_difference,
    saved_model_cli_run,
)

TASKS = ("image", "tabular", "regression", "text")


@pytest.mark.parametrize("name", [*TASKS, "tabular-best"])
def test_the_graph_mode_loader_serves_the_training_time_model(name, served, tmp_path):
    run = served(name.split("-")[0])
    export_dir = os.path.join(run.model_dir, "export", "best") if name.endswith("best") else run.export_dir
    inputs = run.eval_inputs()
    loaded = loaded_outputs(export_dir, inputs)
    # export/best/ holds earlier weights than the final model's: test_the_best_export_holds_the_best_checkpoint
    # checks them against best/; here the two loaders must agree.
    expected = loaded if name.endswith("best") else run.expected(inputs)
    result = saved_model_cli_run(export_dir, inputs, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_outputs(cli_outputs(tmp_path, expected), expected)
    assert_same_outputs(loaded, expected)
    if run.trainer.task.kind == "classification":  # Class names, as the dataset names its labels.
        names = np.array([run.trainer.task.class_names[index] for index in expected["classes"]], dtype=object)
        np.testing.assert_array_equal(cli_outputs(tmp_path, ["class_names"])["class_names"].astype(str),
                                      names.astype(str))


def test_the_best_export_holds_the_best_checkpoint(served):
    """export/best/ of the tabular run: the weights of model_dir/best/, restored into a copy of the model."""
    run = served("tabular")
    best = json.load(open(os.path.join(run.model_dir, "best", "best.json")))
    trainer = run.trainer
    restored = keras.models.clone_model(trainer.model)
    checkpoint = tf.train.Checkpoint(model=restored)
    checkpoint.read(best["checkpoint"]).expect_partial()
    inputs = run.eval_inputs()
    expected = trainer.task.serve(restored, {name: tf.constant(value) for name, value in inputs.items()})
    assert_same_outputs(loaded_outputs(os.path.join(run.model_dir, "export", "best"), inputs),
                        {name: value.numpy() for name, value in expected.items()})


def test_the_export_as_written_before_fails_in_the_graph_mode_loader(served, tmp_path):
    """Negative control: what training/run_directory/export.py wrote before (a tf.Module holding the Keras model,
    saved with
    tf.saved_model.save) loads in tf.saved_model.load but not where servers load it."""
    run = served("image")
    task, model = run.trainer.task, run.trainer.model

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def serve(self, **inputs):
            return task.serve(self.model, inputs)

    module = Module()
    signature = tf.function(module.serve).get_concrete_function(**task.serving_signature())
    tf.saved_model.save(module, str(tmp_path / "old"), signatures={"serving_default": signature})
    inputs = run.eval_inputs(4)
    assert_same_outputs(loaded_outputs(str(tmp_path / "old"), inputs), run.expected(inputs))
    result = saved_model_cli_run(str(tmp_path / "old"), inputs, tmp_path)
    assert result.returncode != 0 and "Could not find variable" in result.stderr


def test_a_batch_of_the_wrong_shape_is_refused_not_a_crash(served, tmp_path):
    """A 3-D batch aborted a server in a convolution's shape check, a 9 x 9 image passed pooling. The graph-mode
    loader refuses both when they are fed (its placeholders have the signature's shapes): a Python error, exit 1,
    not an abort (-6); the signature called eagerly checks them first (tf.ensure_shape)."""
    run = served("image")
    for shape in ((2, 8, 8), (2, 9, 9, 1)):
        result = saved_model_cli_run(run.export_dir, {"images": np.zeros(shape, np.uint8)}, tmp_path)
        assert result.returncode == 1 and "Cannot feed value of shape" in result.stderr, (shape, result.stderr[-2000:])
        with pytest.raises(tf.errors.InvalidArgumentError):
            loaded_outputs(run.export_dir, {"images": np.zeros(shape, np.uint8)})


@pytest.mark.parametrize("name", TASKS)
def test_the_warmup_requests_are_eval_examples_that_the_signature_serves(name, served):
    run = served(name)
    records = warmup.read(os.path.join(run.export_dir, "assets.extra", "tf_serving_warmup_requests"))
    first = run.eval_inputs(4)
    assert [len(next(iter(record["inputs"].values()))) for record in records] == [1, 2, 4]
    serve = tf.saved_model.load(run.export_dir).signatures["serving_default"]
    for record in records:
        assert record["signature_name"] == "serving_default" and sorted(record["inputs"]) == sorted(first)
        count = len(next(iter(record["inputs"].values())))
        for key, value in record["inputs"].items():
            np.testing.assert_array_equal(value, first[key][:count])
        outputs = serve(**{key: tf.constant(value) for key, value in record["inputs"].items()})
        assert_same_outputs({key: value.numpy() for key, value in outputs.items()}, run.expected(record["inputs"]))


def _docs_requests() -> dict:
    """{config file: parsed request} of every Vertex AI example in docs/serving.md: the ```json block after the
    sentence that names its config as "(`configs/....gin`):"."""
    text = open(os.path.join(REPO_ROOT, "docs", "serving.md")).read()
    return {config: json.loads(block) for config, block in
            re.findall(r"\(`(configs/[\w/]+\.gin)`\):.*?```json\n(.*?)```", text, flags=re.S)}


@pytest.mark.parametrize("name", TASKS)
def test_the_vertex_ai_requests_run_through_the_signature(name, served):
    """docs/serving.md's example request for the task, and the export's own example_request.json, converted to a
    batch as TF Serving's REST API does (list of instances -> one column per input), give the training-time model's
    outputs."""
    run = served(name)
    described = json.load(open(os.path.join(run.export_dir, "assets.extra", "serving_metadata.json")))
    documented = _docs_requests()
    assert run.gin_file in documented, f"docs/serving.md has no example request for {run.gin_file}"
    own = json.load(open(os.path.join(run.export_dir, "assets.extra", "example_request.json")))
    for request in (documented[run.gin_file], own):
        batch = requests.to_batch(request, described["inputs"])
        assert len(next(iter(batch.values()))) == len(request["instances"])
        assert_same_outputs(loaded_outputs(run.export_dir, batch), run.expected(batch))
    np.testing.assert_array_equal(next(iter(requests.to_batch(own, described["inputs"]).values())),
                                  next(iter(run.eval_inputs(2).values())))


def test_vertex_instances_convert_like_the_rest_api():
    inputs = {"features": {"dtype": "float32", "shape": [None, 2]}}
    rows = requests.to_batch({"instances": [[1, 2], [3.5, 4]]}, inputs)["features"]  # Bare values: one input.
    assert rows.dtype == np.float32 and rows.tolist() == [[1, 2], [3.5, 4]]
    text = requests.to_batch({"instances": [{"text": "ok"}, {"text": {"b64": "w7w="}}]},
                             {"text": {"dtype": "string", "shape": [None]}})["text"]
    assert text.tolist() == [b"ok", "ü".encode()]
    for bad, message in (({"instances": []}, "empty"), ({"rows": []}, "instances"),
                         ({"instances": [[1, 2, 3]]}, r"shape \(2,\)"), ({"instances": [{"feature": [1, 2]}]},
                                                                          "has no 'features'")):
        with pytest.raises(ValueError, match=message):
            requests.to_batch(bad, inputs)
    with pytest.raises(ValueError, match="whole numbers from 0 to 255"):
        requests.to_batch({"instances": [[300]]}, {"images": {"dtype": "uint8", "shape": [None, 1]}})


@pytest.mark.parametrize("name", ["image", "tabular", "regression"])
def test_the_tflite_model_matches_the_saved_model(name, served):
    run = served(name)
    described = metadata.read_local(run.export_dir)
    assert described["tflite"]["file"] == "model.tflite"
    inputs = run.eval_inputs(16)
    expected = loaded_outputs(run.export_dir, inputs)
    outputs = litert_runner(os.path.join(run.export_dir, "model.tflite"))(**inputs)
    assert sorted(outputs) == described["tflite"]["outputs"] == sorted(key for key in expected
                                                                       if key != "class_names")
    assert_same_outputs(outputs, {key: expected[key] for key in outputs})
    if "class_names" in expected:  # labels.txt beside model.tflite: line i names class i, as the metadata does.
        labels = open(os.path.join(run.export_dir, described["tflite"]["labels"])).read().splitlines()
        assert labels == described["class_names"] == list(run.trainer.task.class_names)
        assert [labels[index] for index in outputs["classes"]] == [name.decode() for name in expected["class_names"]]
    else:
        assert "labels" not in described["tflite"] and not os.path.exists(os.path.join(run.export_dir, "labels.txt"))


def test_the_text_export_says_why_it_has_no_tflite_model(served):
    run = served("text")
    assert not os.path.exists(os.path.join(run.export_dir, "model.tflite"))
    assert os.path.isfile(os.path.join(run.export_dir, "saved_model.pb"))
    said = [message for message in run.export_logs if "model.tflite" in message]
    assert len(said) == 1 and "\n" not in said[0] and "LowerBound" in said[0] and "complete" in said[0], said
    assert metadata.read_local(run.export_dir)["tflite"]["file"] is None


@pytest.mark.slow
def test_mode_export_writes_model_tflite_only_when_asked(served, tmp_path):
    """Through train.py: --mode=export with experiment.export_tflite=True on a copy of the image run; the default
    (off) writes none. Also the relative measure's negative control: a difference of 1e-4 fails 1e-5."""
    import shutil

    run = served("image")
    model_dir = tmp_path / "run"
    shutil.copytree(run.model_dir, model_dir)
    shutil.rmtree(model_dir / "export")
    params = [f"--gin_param={param}" for param in run.params if "export_tflite" not in param]
    result = run_train_py(f"--gin_file={run.gin_file}", *params, f"--model_dir={model_dir}", "--mode=export")
    assert result.returncode == 0, result.stderr[-2000:]
    export_dir = model_dir / "export" / str(STEPS)
    assert (export_dir / "saved_model.pb").is_file() and not (export_dir / "model.tflite").exists()
    assert "tflite" not in metadata.read_local(str(export_dir))
    result = run_train_py(f"--gin_file={run.gin_file}", *params, "--gin_param=experiment.export_tflite=True",
                          f"--model_dir={model_dir}", "--mode=export")
    assert result.returncode == 0, result.stderr[-2000:]
    assert (export_dir / "model.tflite").is_file()
    assert relative_difference(np.array([1.0001]), np.array([1.0])) > 1e-5


@pytest.mark.parametrize("name", TASKS)
def test_the_metadata_describes_the_signature(name, served):
    run = served(name)
    described = metadata.read_local(run.export_dir)
    task = run.trainer.task
    signature = tf.saved_model.load(run.export_dir).signatures["serving_default"]
    assert described["inputs"] == {key: metadata.tensor_description(spec)
                                   for key, spec in signature.structured_input_signature[1].items()}
    assert described["outputs"] == {key: metadata.tensor_description(spec)
                                    for key, spec in signature.structured_outputs.items()}
    assert described["task"] == type(task).__name__ and described["kind"] == task.kind
    if task.kind == "classification":
        assert described["class_names"] == list(task.class_names)
    if name in ("tabular", "regression"):
        assert described["feature_names"] == list(task.feature_names) and len(task.feature_names) == \
            task.num_features


def test_a_task_without_serving_example_exports_without_requests(served, tmp_path):
    """A forker's task that defines no serving_example: the SavedModel and its metadata, no warmup or example
    request (instead of a failed export)."""
    import dataclasses

    from serving.examples import first_examples
    from tasks.base import Task
    from tasks.image_classification import ImageClassification
    from training.run_directory.export import export_saved_model

    @dataclasses.dataclass(frozen=True)
    class Bare(ImageClassification):
        serving_example = Task.serving_example

    run = served("image")
    trainer = run.trainer
    task = Bare(**{field.name: getattr(trainer.task, field.name) for field in dataclasses.fields(trainer.task)})
    examples = first_examples(task, trainer.builder, trainer.dataset_spec.eval_split, 4)
    assert examples is None
    assert first_examples(trainer.task, trainer.builder, trainer.dataset_spec.eval_split, 4)["images"].shape == \
        (4, 8, 8, 1)  # Control: the shipped task has them.
    export_dir = export_saved_model(trainer.model, task, str(tmp_path / "export" / "1"), examples=examples)
    assert sorted(os.listdir(os.path.join(export_dir, "assets.extra"))) == ["serving_metadata.json"]
    assert "tflite" not in metadata.read_local(export_dir)  # Off unless asked for.
    assert not os.path.exists(os.path.join(export_dir, "model.tflite"))


def test_export_tflite_must_be_a_boolean(small_config):
    from common.errors import ConfigError

    assert small_config().export_tflite is False  # Off by default.
    with pytest.raises(ConfigError, match=r"experiment.export_tflite='yes' must be True or False; e.g. "
                                          r"--gin_param=\"experiment.export_tflite=True\""):
        small_config(export_tflite="yes")


def test_feature_names_must_name_every_feature():
    from tasks.tabular import TabularClassification

    assert TabularClassification(num_features=2).column_names == ("feature_0", "feature_1")
    with pytest.raises(ValueError, match="has 1 feature_names for num_features=2"):
        TabularClassification(num_features=2, feature_names=("a",)).bind(None)

