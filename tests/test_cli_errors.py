"""Bad input gets a clear error naming the value and the fix, and exit code 2, before any training step."""

import os

import pytest

import train
from helpers import run_train_py

DIGITS = "configs/experiments/digits_mlp.gin"


@pytest.mark.parametrize("gin_params, expected", [
    (["STRATEGY='tpu_v9'"], "Unknown STRATEGY='tpu_v9'"),
    (["MODEL='resnet9000'"], "Unknown MODEL='resnet9000' (did you mean 'resnet'?). Known models: cnn, "
                                "keras_application, mlp"),
    (["DATASET='imagenet21k'"], "Unknown DATASET='imagenet21k'"),
    (["STRATEGY='mirrored'", "VIRTUAL_DEVICES=3", "GLOBAL_BATCH_SIZE=64"],
     "GLOBAL_BATCH_SIZE=64 does not divide by the 3 replicas of this strategy. Use a multiple of 3, e.g. 63 or 66"),
    (["TRAIN_STEPS=0"], 'TRAIN_STEPS=0 must be an integer >= 1; e.g. --gin_param="TRAIN_STEPS=1000"'),
    (["TRAIN_STEPS=-5"], "TRAIN_STEPS=-5 must be an integer >= 1"),
    (["STEPS_PER_LOOP=0"], "STEPS_PER_LOOP=0 must be an integer >= 1"),
    (["EVAL_EVERY=150"], "EVAL_EVERY=150 must be a multiple of STEPS_PER_LOOP=100 (the host only acts between loops); "
                         'e.g. --gin_param="EVAL_EVERY=200"'),
    # Fields without a macro in configs/base.gin are named as they are set: experiment.<field>.
    (["experiment.checkpoints_to_keep=0"], "experiment.checkpoints_to_keep=0 must be an integer >= 1; e.g. "
                                           '--gin_param="experiment.checkpoints_to_keep=3"'),
    (["experiment.startup_timeout_seconds=0"], "experiment.startup_timeout_seconds=0 must be an integer >= 1; e.g. "
                                               '--gin_param="experiment.startup_timeout_seconds=300"'),
    (["experiment.target_replicas=-8"], "experiment.target_replicas=-8 must be an integer >= 0"),
    (["experiment.clip_global_norm=-1.0"], "experiment.clip_global_norm=-1.0 must be > 0, or None to disable "
                                           'clipping; e.g. --gin_param="experiment.clip_global_norm=1.0"'),
    (["LEARNING_RATE=-0.1"], "LEARNING_RATE=-0.1 must be a finite number > 0"),
    (["PRECISION='float8'"], "PRECISION='float8' is not one of"),
    (["VIRTUAL_DEVICES=2"], "VIRTUAL_DEVICES=2 only works with STRATEGY='mirrored'"),
    (["experiment.optimizer='lion'"], "Unknown experiment.optimizer='lion'. Known optimizers: adam, adamw, "
                                      "lamb, lars, sgd. Register a new one in training/learning/optimizers.py; e.g. "
                                      "--gin_param=\"experiment.optimizer='adam'\"."),
    (["experiment.lr_schedule='onecycle'"], "Unknown experiment.lr_schedule='onecycle'. Known schedules: "
                                            "constant, cosine, polynomial, step. Register a new one in "
                                            "training/learning/schedules.py; e.g. "
                                            "--gin_param=\"experiment.lr_schedule='cosine'\"."),
    (["experiment.lr_schedule='step'", "step.boundaries=[500, 2000]"],
     "step.boundaries=[500, 2000] (steps [500, 2000]) must lie after step.warmup_steps=0 and before TRAIN_STEPS=1000: "
     "move the boundaries inside, lower step.warmup_steps or raise TRAIN_STEPS."),
    (["cosine.warmup_steps=1000"], "cosine.warmup_steps=1000 must be an integer >= 0 and < TRAIN_STEPS=1000: lower "
                                   "cosine.warmup_steps or raise TRAIN_STEPS."),
    (["experiment.optimizer='lars'", "lars.exclude_from_weight_decay='bias'"],
     "lars.exclude_from_weight_decay='bias' must be a list of regular expressions"),
    (["mlp.no_such_argument=1"], "Could not parse the gin configuration"),
    # An unquoted string: gin's own text is Python's AST repr; ours says what a value may be and how to write it.
    (["EMA_DECAY=x"], "Failed to parse token 'x' (line 1). Gin values are Python literals: 'x' is neither a number, "
                      "True/False, a quoted string nor a @configurable or %MACRO reference; e.g. "
                      "--gin_param=\"EMA_DECAY=0.999\" for a number"),
    # Checked with the config, before the strategy is made (on a TPU that takes minutes); here no TPU exists.
    (["STRATEGY='tpu'", "PROFILE_STEPS=(5, 2)"], "PROFILE_STEPS=(5, 2) must be (start, stop) with 0 <= start < stop"),
    (["STRATEGY='tpu'", "BEST_MODE='maximum'"], "BEST_MODE='maximum' must be 'max', 'min' or 'auto'"),
    (["STRATEGY='tpu'", "BEST_METRIC='accuracy'"], "BEST_METRIC='accuracy' must name an evaluation metric"),
    # A misspelt best metric: refused before training, not at the first evaluation hours later.
    (["BEST_METRIC='eval/acuracy'", "EVAL_EVERY=100000"],
     "BEST_METRIC='eval/acuracy': the evaluation reports no 'acuracy' (it reports loss, accuracy)"),
])
def test_bad_config_exits_2_with_a_clear_message(gin_params, expected, tmp_path, capsys, data_dir):
    args = ["train.py", f"--gin_file={DIGITS}", f"--model_dir={tmp_path}"] + [f"--gin_param={p}" for p in gin_params]
    assert train.main(args) == 2
    assert expected in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "checkpoints")  # Nothing started.


@pytest.mark.parametrize("gin_param, expected", [
    ("experiment.optimizer='LARS'", "Unknown experiment.optimizer='LARS' (did you mean 'lars'?). Known optimizers: "
                                    "adam, adamw, lamb, lars, sgd."),
    ("experiment.optimizer='adamw '", "Unknown experiment.optimizer='adamw ' (did you mean 'adamw'?)."),
    ("experiment.optimizer='sgdd'", "Unknown experiment.optimizer='sgdd' (did you mean 'sgd'?)."),
    ("MODEL='CNN'", "Unknown MODEL='CNN' (did you mean 'cnn'?). Known models:"),
    ("experiment.jit_compile=True", "experiment.jit_compile=True is not one of 'off', 'on', 'auto'; did you mean "
                                    "--gin_param=\"experiment.jit_compile='on'\"?"),
    ("experiment.jit_compile=False", "did you mean --gin_param=\"experiment.jit_compile='off'\"?"),
    ("PRECISION='Float64'", "did you mean --gin_param=\"PRECISION='float64'\"?"),
    ("STRATEGY='Mirrored'", "Unknown STRATEGY='Mirrored' (did you mean 'mirrored'?)"),
])
def test_a_misspelt_name_gets_the_one_it_meant(gin_param, expected, tmp_path, capsys, data_dir):
    assert train.main(["train.py", f"--gin_file={DIGITS}", f"--model_dir={tmp_path}", f"--gin_param={gin_param}"]) == 2
    assert expected in capsys.readouterr().err


def test_every_registry_by_name_suggests_the_name_meant(data_dir):
    """Models, datasets, losses, metrics, schedules, optimizers, observers and augmentations: another case, a stray
    space or a typo gets "did you mean"; a name close to nothing gets none (the negative control)."""
    from common.errors import ConfigError
    from common.registry import lookup
    from data.registry import get_dataset_spec
    from models.registry import get_model_builder
    from tasks.augmentation import by_name as augmentation
    from training.learning.losses import get_loss
    from training.learning.metrics import make_metrics
    from training.learning.optimizers import make_optimizer
    from training.observers.standard import OBSERVERS

    task = get_dataset_spec("digits").task
    asks = {
        "'MLP'": (lambda name: get_model_builder(name), "MLP", "mlp"),
        "'Digits'": (lambda name: get_dataset_spec(name), "Digits", "digits"),
        "'softmax_cross_entropy '": (lambda name: get_loss(name), "softmax_cross_entropy ", "softmax_cross_entropy"),
        "'acuracy'": (lambda name: make_metrics([name], task), "acuracy", "accuracy"),
        "'cosin'": (lambda name: make_optimizer("sgd", learning_rate=0.1, schedule=name, train_steps=10), "cosin",
                    "cosine"),
        "'Adam'": (lambda name: make_optimizer(name, learning_rate=0.1, schedule="constant", train_steps=10), "Adam",
                   "adam"),
        "'tensorbord'": (lambda name: lookup(OBSERVERS, name, named=f"observer {name!r}", known="observers",
                                             where="training/observers/standard.py"), "tensorbord", "tensorboard"),
        "'cut_mix'": (lambda name: augmentation.check([name], task, dataset="digits"), "cut_mix", "cutmix"),
    }
    for typed, (ask, name, meant) in asks.items():
        with pytest.raises(ConfigError, match=rf"{typed} \(did you mean '{meant}'\?\)"):
            ask(name)
        with pytest.raises(ConfigError) as error:
            ask("qqqq")
        assert "did you mean" not in str(error.value) and "Unknown" in str(error.value)


def test_missing_gin_file_exits_2(tmp_path, capsys):
    assert train.main(["train.py", "--gin_file=configs/nope.gin", f"--model_dir={tmp_path}"]) == 2
    assert "--gin_file='configs/nope.gin' does not exist" in capsys.readouterr().err


def test_missing_required_macro_exits_2(tmp_path, capsys):
    assert train.main(["train.py", "--gin_file=configs/base.gin", f"--model_dir={tmp_path}"]) == 2
    assert "does not set MODEL, DATASET, GLOBAL_BATCH_SIZE, TRAIN_STEPS, LEARNING_RATE" in capsys.readouterr().err


def test_eval_without_a_checkpoint_exits_2(tmp_path, capsys, data_dir):
    assert train.main(["train.py", f"--gin_file={DIGITS}", f"--model_dir={tmp_path}", "--mode=eval"]) == 2
    assert "No checkpoint in" in capsys.readouterr().err


def test_exit_code_2_through_the_real_command_line(tmp_path):
    result = run_train_py("--gin_param=MODEL='nope'", f"--model_dir={tmp_path}")
    assert result.returncode == 2
    assert "Unknown MODEL='nope'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("gin_params, expected", [
    # The text task gives the model a vocab_size; mlp takes none: the message names the model that fits.
    (["DATASET='synthetic_reviews'"], "MODEL='mlp' does not fit DATASET='synthetic_reviews': its task "
                                      "(TextClassification) gives the model vocab_size, which mlp() does not take. "
                                      "Use a model built for this task (MODEL='transformer')"),
    # The transformer needs a vocabulary size, which an image task does not give.
    (["MODEL='transformer'"], "MODEL='transformer' does not fit DATASET='digits': its task (ImageClassification) does "
                              "not give the model vocab_size, which transformer() needs. Use a model built for this "
                              "task (MODEL='mlp', MODEL='cnn', MODEL='resnet', MODEL='keras_application')"),
    # Given a vocabulary size by hand, it gets as far as its own check of the input shape.
    (["MODEL='transformer'", "transformer.vocab_size=100"],
     "MODEL='transformer' cannot be built for DATASET='digits' (inputs of shape (8, 8, 1), 10 outputs): ValueError: "
     "transformer takes token ids of shape (length,); got input_shape=(8, 8, 1). Use it with a text task"),
])
def test_a_model_that_does_not_fit_the_data_exits_2_naming_both(gin_params, expected, tmp_path, capsys, data_dir):
    args = ["train.py", f"--gin_file={DIGITS}", f"--model_dir={tmp_path}"] + [f"--gin_param={p}" for p in gin_params]
    assert train.main(args) == 2
    assert expected in capsys.readouterr().err


def _registered_with(monkeypatch, name: str, **task_changes) -> None:
    import dataclasses

    from data import registry

    spec = registry.DATASETS[name]
    monkeypatch.setitem(registry.DATASETS, name,
                        dataclasses.replace(spec, task=dataclasses.replace(spec.task, **task_changes)))


@pytest.mark.parametrize("dataset, gin_file, task_changes, expected", [
    ("digits", DIGITS, {"label_key": "target"},
     "DATASET='digits': its task ImageClassification reads the feature(s) 'target', which 'sklearn_digits' does not "
     "have. Its features are 'image', 'label'"),
    ("breast_cancer", "configs/experiments/breast_cancer_mlp.gin", {"features_key": "x"},
     "its task TabularClassification reads the feature(s) 'x'"),
    ("synthetic_reviews", "configs/experiments/synthetic_reviews_transformer.gin", {"text_key": "review"},
     "its task TextClassification reads the feature(s) 'review', which 'synthetic_reviews' does not have"),
    ("digits", DIGITS, {"num_classes": 5},
     "DATASET='digits': its task ImageClassification has 5 classes, but 'sklearn_digits' labels 'label' with 10 (0, 1, "
     "2, 3, 4, ...)"),
    ("digits", DIGITS, {"image_shape": (28, 28, 1)},
     "its task ImageClassification expects 'image' of shape (28, 28, 1), but 'sklearn_digits' stores shape (8, 8, 1)"),
    ("breast_cancer", "configs/experiments/breast_cancer_mlp.gin", {"num_features": 20},
     "its task TabularClassification expects 'features' of shape (20,), but 'sklearn_breast_cancer' stores shape "
     "(30,)"),
    ("synthetic_reviews", "configs/experiments/synthetic_reviews_transformer.gin",
     {"max_tokens": 4, "vocabulary": ("good", "bad", "not")},
     "DATASET='synthetic_reviews': its task TextClassification does not fit the data: TextClassification vocabulary "
     "has 3 words, more than max_tokens - 2 = 2"),
])
def test_a_task_that_does_not_fit_its_dataset_exits_2_before_training(dataset, gin_file, task_changes, expected,
                                                                       tmp_path, capsys, monkeypatch, data_dir):
    """A forker's task edit in data/registry.py (a wrong feature key, a vocabulary too big) is a clear error."""
    _registered_with(monkeypatch, dataset, **task_changes)
    assert train.main(["train.py", f"--gin_file={gin_file}", f"--model_dir={tmp_path}"]) == 2
    assert expected in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "checkpoints")


@pytest.mark.parametrize("gin_file, params, expected", [
    ("configs/experiments/breast_cancer_mlp.gin", ["experiment.loss='mean_squared_error'"],
     "experiment.loss='mean_squared_error' is a regression loss; TabularClassification is a classification task. "
     "Use 'softmax_cross_entropy'"),
    ("configs/experiments/synthetic_housing_mlp.gin", ["experiment.loss='softmax_cross_entropy'"],
     "experiment.loss='softmax_cross_entropy' is a classification loss; TabularRegression is a regression task"),
    # A model for images on feature vectors: Keras raised an IndexError (a traceback, exit 1).
    ("configs/experiments/breast_cancer_mlp.gin", ["MODEL='cnn'"],
     "MODEL='cnn' cannot be built for DATASET='breast_cancer' (inputs of shape (30,), 2 outputs): IndexError: tuple "
     "index out of range. Fix its gin bindings (cnn.<argument>=...), or use a model built for this kind of input "
     "(these build for it: MODEL='mlp')."),
])
def test_a_loss_or_model_for_another_kind_of_task_exits_2(gin_file, params, expected, tmp_path, capsys, data_dir):
    args = ["train.py", f"--gin_file={gin_file}", f"--model_dir={tmp_path}"] + [f"--gin_param={p}" for p in params]
    assert train.main(args) == 2
    assert expected in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "checkpoints")


def test_a_loss_that_returns_a_mean_exits_2_before_any_step(tmp_path, capsys, monkeypatch, data_dir):
    """The silent factor-of-R bug, as a user would write it: a loss that averages. Rejected before training."""
    import tensorflow as tf

    from training.learning import losses

    monkeypatch.setitem(losses.LOSSES, "mean_loss", lambda labels, logits: tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)))
    assert train.main(["train.py", f"--gin_file={DIGITS}", f"--model_dir={tmp_path}",
                       "--gin_param=experiment.loss='mean_loss'"]) == 2
    assert ("experiment.loss='mean_loss' returned () for a batch of 2 examples; a loss must return one loss per "
            "example, shape [2]") in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "checkpoints")


def test_a_classification_task_on_real_valued_targets_exits_2(tmp_path, capsys, monkeypatch, data_dir):
    """Class ids read from a float column: the labels would be out of range (or silently truncated) mid-run."""
    import dataclasses

    from data import registry
    from tasks.tabular import TabularClassification

    spec = registry.DATASETS["synthetic_housing"]
    monkeypatch.setitem(registry.DATASETS, "synthetic_housing", dataclasses.replace(
        spec, task=TabularClassification(num_features=8, num_classes=2, label_key="target")))
    args = ["train.py", "--gin_file=configs/experiments/synthetic_housing_mlp.gin", f"--model_dir={tmp_path}",
            "--gin_param=experiment.metrics=['accuracy']"]
    assert train.main(args) == 2
    assert ("its task TabularClassification is a classification task, but 'synthetic_housing' stores 'target' as "
            "float32, not class ids") in capsys.readouterr().err
