"""Trainer: the model, optimizer, metrics, data and compiled loops of one run, built under one strategy.

It knows how to run N training steps and one exact evaluation; it does not decide when (training/controller.py
does). The replica-invariance check (training/replica_invariance.py) builds Trainers at several replica counts.
"""

import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable, Collection

import keras
import tensorflow as tf

from common.errors import ConfigError
from data import builders, device_split, pipeline, service
from data.registry import bind_task, get_dataset_spec
from models import batch_norm_sync
from models.registry import MODELS, get_model_builder
from tasks.augmentation import by_name as augmentation
from tpu_utils import loop
from tpu_utils.strategy import io_device_for, is_multi_worker
from training import jit_compile
from training.batching import batching_for
from training.build_scope import seeded_build
from training.learning import accumulation, step
from training.learning.ema import WeightAverage, maybe_swapped
from training.learning.losses import check_per_example_losses, get_loss
from training.learning.metrics import make_metrics
from training.learning.optimizers import make_optimizer
from training.variable_selection import freeze, frozen_layer_variables
from training.warm_start import warm_start

log = logging.getLogger(__name__)

# MODEL name -> the arguments of its builder bound outside the Trainer's model_options (by gin).
BoundArguments = Callable[[str], Collection[str]]


def nothing_bound(model_name: str) -> Collection[str]:
    """No model argument is bound outside `model_options` (a Trainer built without gin)."""
    return ()


class Trainer:
    """Builds everything for `config` under `strategy`; `model_options` override the model builder's arguments.
    `bound_arguments(MODEL)` names the arguments of that model's builder that are bound elsewhere (gin: the entry
    point passes training/experiment.py's `bound_model_arguments`), so that a missing one can be told from a given
    one before the build; the Trainer itself never reads gin.

    `training=False` (--mode=eval/export) skips the check that GLOBAL_BATCH_SIZE divides by the replicas: evaluation
    has its own batch, so a run can be evaluated on any replica count.
    """

    def __init__(self, config, strategy: tf.distribute.Strategy, *, model_options: dict | None = None,
                 training: bool = True, bound_arguments: BoundArguments = nothing_bound, input_services=None):
        self.config = config
        self.strategy = strategy
        self.input_services = input_services  # DATA_SERVICE's data/service.InputServices, started by the caller.
        # How each step's examples split over the replicas and micro-batches; a ConfigError if they do not.
        self.batching = batching_for(config, strategy.num_replicas_in_sync, training=training)
        # --preflight builds TPU configs on virtual CPUs: the config's strategy says where it will run.
        self.on_tpu = config.strategy == "tpu" or isinstance(strategy, tf.distribute.TPUStrategy)
        model_builder = get_model_builder(config.model)  # An unknown MODEL: exit 2 before the data is prepared.
        batch_norm_sync.install()  # Synchronized BatchNormalization traced in linear time (models/batch_norm_sync.py).
        self._prepare_data(training=training)
        # The build sets Keras' dtype policy and the seeds for itself only (same SEED -> same initial weights).
        with seeded_build(config.precision, config.seed), strategy.scope():
            self._build_state(model_builder, model_options, bound_arguments)
        # Why tf.data on the host makes the batches (None: the split is on the devices; impossible 'always': exit 2).
        self.host_input_reason = device_split.host_reason(
            config.train_data_on_device, self.dataset_spec, self.builder, on_tpu=self.on_tpu,
            multi_worker=is_multi_worker(strategy), data_service=bool(service.parse(config.data_service)),
            state=device_split.state_bytes([*self.model.variables, *self.optimizer.variables])
        ) if training else "not training"
        self.train_data_on_device = self.host_input_reason is None
        self._device_split = None
        self._build_loops()
        # EMA off: no `ema` entry, so the default run's checkpoint is what it always was.
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.global_step,
                                              **({"ema": self.ema.trackable} if self.ema is not None else {}))

    def _prepare_data(self, *, training: bool) -> None:
        """The dataset prepared in DATA_DIR, its task (what is learned) with experiment.augmentation applied, the
        step's mixing (mixup, CutMix) and the per-example loss."""
        config = self.config
        spec = get_dataset_spec(config.dataset, config.data_dir)
        # Asked of the registered task, before the dataset is prepared (minutes for a large one).
        augmentation.check(config.augmentation, spec.task, dataset=config.dataset)
        self.builder = builders.load_builder(spec, config.data_dir)  # The TFDS builder, prepared in DATA_DIR.
        # The task completed from the prepared dataset (class names, feature statistics): what is learned.
        dataset_spec = bind_task(spec, self.builder, dataset=config.dataset)
        task, mixing = augmentation.resolve(config.augmentation, dataset_spec.task, dataset=config.dataset,
                                            rows_per_batch=self.batching.micro_batch if training else 0)
        self.dataset_spec, self.task = dataclasses.replace(dataset_spec, task=task), task
        self.mixing = functools.partial(mixing, seed=config.seed, num_classes=task.output_size,
                                        global_batch_size=config.global_batch_size) if mixing else None
        self.loss_name = config.loss or task.default_loss  # experiment.loss, else the task's.
        self.loss_fn = get_loss(self.loss_name, task)

    def _build_state(self, model_builder, model_options: dict | None, bound_arguments: BoundArguments) -> None:
        """Under the strategy's scope: the model, its optimizer (built: slots before tracing and restoring), the
        trained and frozen variables, the EMA, the step counter and the metrics."""
        config = self.config
        self.model = _build_model(config, model_builder, self.task, model_options, bound_arguments)
        self.optimizer = make_optimizer(config.optimizer, learning_rate=config.learning_rate,
                                        schedule=config.lr_schedule, train_steps=config.train_steps,
                                        variables=self.model.trainable_variables)
        if config.precision == "mixed_float16":  # float16 gradients underflow without loss scaling.
            self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer)
        # experiment.trainable / frozen: the variables the optimizer builds slots for and updates.
        self.trainable_variables, self.frozen_variables = freeze(self.model, trainable=config.trainable,
                                                                 frozen=config.frozen)
        if self.frozen_variables:
            log.info("Frozen (experiment.trainable/frozen; not trained): %s.",
                     ", ".join(variable.path for variable in self.frozen_variables))
        self.optimizer.build(self.trainable_variables)
        # EMA_DECAY: a moving average of the trained weights, evaluated and exported (training/learning/ema.py).
        self.ema = WeightAverage(self.trainable_variables, config.ema_decay) if config.ema_decay else None
        # Global batches consumed: positions the data on resume. Not optimizer.iterations, which does not count a
        # step that loss scaling skipped.
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self.train_metrics = make_metrics(config.metrics, self.task)
        self.eval_loss = keras.metrics.Mean("loss")
        self.eval_metrics = make_metrics(config.metrics, self.task)

    def _build_loops(self) -> None:
        """The replica steps and the on-device loops of training and evaluation, and the eval input; checks that the
        loss gives per-example losses for the eval split's targets (and the mixed soft targets)."""
        config, strategy = self.config, self.strategy
        # k=1 is the plain step, unchanged; k>1 sums k micro-batches' gradients per optimizer step.
        make_step = step.make_train_step if config.accumulate_steps == 1 else functools.partial(
            accumulation.make_accumulating_train_step, accumulate_steps=config.accumulate_steps)
        # experiment.jit_compile: the forward and backward pass under XLA (never with accumulation: resolve says so).
        self.jit_compile = jit_compile.resolve(config, self.model, replicas=strategy.num_replicas_in_sync,
                                               mirrored=jit_compile.is_mirrored(strategy), on_tpu=self.on_tpu,
                                               per_replica_batch=self.batching.per_replica)
        self.train_step = make_step(self.model, self.optimizer, self.loss_fn,
                                    global_batch_size=config.global_batch_size,
                                    clip_global_norm=config.clip_global_norm, metrics=self.train_metrics,
                                    seed=config.seed, variables=self.trainable_variables, mixing=self.mixing,
                                    **({"jit_compile": True} if self.jit_compile else {}))
        if self.ema is not None:
            self.train_step = self.ema.after(self.train_step)
        # The training loss is the data loss, as in evaluation; the regularization term is reported apart.
        self._train_outputs = ("loss", "regularization") if self.model.losses else ("loss",)
        replica_local = self.model.non_trainable_variables
        if self.frozen_variables:  # Frozen layers' variables never change: averaging them could only round them.
            unchanging = frozen_layer_variables(self.model)
            replica_local = [variable for variable in replica_local if id(variable) not in unchanging]
        self._train_loop = loop.make_train_loop(
            strategy, self.train_step, self.global_step, replica_local,
            outputs=self._train_outputs, accumulate_dtype=tf.float64 if config.precision == "float64" else tf.float32)
        eval_step = step.make_eval_step(self.model, self.loss_fn, loss=self.eval_loss, metrics=self.eval_metrics)
        self._eval_loop = loop.make_eval_loop(strategy, eval_step)
        self.eval_input_fn, self._eval_steps = pipeline.make_eval_input_fn(
            self.dataset_spec, self.builder, global_batch_size=self.batching.eval_global_batch)
        self._eval_dataset = strategy.distribute_datasets_from_function(self.eval_input_fn)
        _, target_spec, _ = self.eval_input_fn(tf.distribute.InputContext()).element_spec
        check_per_example_losses(self.loss_fn, self.loss_name, target_spec, self.model.output)
        if self.mixing is not None:  # Mixed batches give the loss soft targets [batch, classes].
            check_per_example_losses(self.loss_fn, self.loss_name,
                                     tf.TensorSpec([None, self.task.output_size], tf.float32), self.model.output)

    def warm_start(self) -> dict:
        """Loads the model variables from INIT_FROM (training/warm_start.py); the optimizer and the step stay new."""
        loaded = warm_start(self.model, self.config.init_from, include=self.config.init_include,
                            exclude=self.config.init_exclude)
        if self.ema is not None:
            self.ema.reset()  # The average of a warm-started run starts from the loaded weights.
        return loaded

    def serving_weights(self):
        """A block in which the model holds the weights to evaluate and export: the EMA's when EMA_DECAY is set
        (swapped in, then back bit for bit), else the trained ones (a no-op)."""
        return maybe_swapped(self.ema)

    def restore(self, checkpoint_path: str) -> None:
        """Restores model, optimizer and step from `checkpoint_path`, keeping the configured learning rate.

        Keras 3 keeps a constant learning rate in an optimizer variable, which the checkpoint would otherwise
        overwrite: a resumed run with a new LEARNING_RATE would silently keep the old one. Schedules are not saved.
        """
        options = tf.train.CheckpointOptions(experimental_io_device=io_device_for(self.strategy, checkpoint_path))
        self.checkpoint.restore(checkpoint_path, options=options).assert_existing_objects_matched()
        if self.config.lr_schedule == "constant":
            self.optimizer.learning_rate = self.config.learning_rate

    @property
    def evaluated_names(self) -> tuple[str, ...]:
        """What `evaluate` reports: 'loss' and the metrics; with EMA_DECAY also raw_<name> for each."""
        names = ("loss", *(metric.name for metric in self.eval_metrics))
        return (*names, *(f"raw_{name}" for name in names)) if self.ema is not None else names

    @property
    def step(self) -> int:
        """Training steps run so far, i.e. global batches consumed (saved in every checkpoint)."""
        return int(self.global_step.numpy())

    def train_input_fn(self):
        """input_fn(InputContext) -> per-replica training batches, positioned at the current step (exact resume)."""
        return pipeline.make_train_input_fn(self.dataset_spec, self.builder, seed=self.config.seed,
                                            start_step=self.step, global_batch_size=self.config.global_batch_size,
                                            services=self.input_services)

    def train_iterator(self):
        """The training data positioned at the current step: the split on the devices when
        experiment.train_data_on_device allows (data/device_split.py; built once, positioned by the step counter),
        else a distributed iterator over the tf.data pipeline."""
        if self.train_data_on_device:
            if self._device_split is None:
                self._device_split = device_split.DeviceSplit(self.dataset_spec, self.builder, self.strategy,
                                                              global_batch_size=self.config.global_batch_size,
                                                              seed=self.config.seed)
            return self._device_split
        return iter(self.strategy.distribute_datasets_from_function(self.train_input_fn()))

    def train(self, iterator, num_steps: int) -> dict:
        """Runs `num_steps` steps on the device; returns the means over them of the global data loss ('loss'), of the
        regularization term ('regularization', if the model has one) and the metrics over those steps."""
        for metric in self.train_metrics:
            metric.reset()
        try:
            means = self._train_loop(iterator, tf.constant(num_steps, tf.int32))
        except tf.errors.OpError as error:  # With DATA_SERVICE: a service restarted or failed -> one line, exit 1.
            explained = self.input_services and service.explained(error, self.input_services.addresses)
            if explained:
                raise explained from error
            raise
        return {**{name: float(means[name].numpy()) for name in self._train_outputs},
                **{metric.name: metric.result() for metric in self.train_metrics}}

    def evaluate(self) -> dict:
        """The loss and the metrics over every example of the eval split, exactly once. With EMA_DECAY: those of
        the EMA weights under the usual names (what BEST_METRIC ranks), and the trained weights' as raw_<name>."""
        if self.ema is None:
            return self._evaluate_once()
        with self.ema.swapped():
            averaged = self._evaluate_once()
        return {**averaged, **{f"raw_{name}": value for name, value in self._evaluate_once().items()}}

    def _evaluate_once(self) -> dict:
        self.eval_loss.reset_state()
        for metric in self.eval_metrics:
            metric.reset()
        self._eval_loop(iter(self._eval_dataset), tf.constant(self._eval_steps, tf.int32))
        return {"loss": float(self.eval_loss.result().numpy()),
                **{metric.name: metric.result() for metric in self.eval_metrics}}



def _build_model(config, builder, task, overrides: dict | None,
                 bound: BoundArguments) -> keras.Model:
    """The model for `task`: the builder called with the task's input shape, output size and options (e.g. a text
    task's vocab_size), then `overrides`. A model that cannot take this task's inputs is a ConfigError naming both."""
    options = {**task.model_options(), **(overrides or {})}
    unexpected, missing = _mismatch(config.model, builder, options, bound)
    if unexpected or missing:
        fitting = ", ".join(f"MODEL={name!r}" for name, other in MODELS.items()
                            if _mismatch(name, other, options, bound) == ([], [])) or "none is registered"
        problem = (f"gives the model {', '.join(unexpected)}, which {config.model}() does not take" if unexpected else
                   f"does not give the model {', '.join(missing)}, which {config.model}() needs")
        raise ConfigError(f"MODEL={config.model!r} does not fit DATASET={config.dataset!r}: its task "
                          f"({type(task).__name__}) {problem}. Use a model built for this task ({fitting}), or "
                          "change your model builder's arguments.")
    try:
        return builder(task.input_shape, task.output_size, **options)
    except ConfigError:  # The builder's own message names its setting and the fix.
        raise
    except _BUILD_ERRORS as error:  # e.g. cnn.filters=(0,); cnn on feature vectors.
        message = " ".join(str(error).split("\n")[0].split())[:300].rstrip(".")  # Without gin's call context.
        fitting = ", ".join(f"MODEL={name!r}" for name in _models_that_build(task, bound, exclude=config.model))
        raise ConfigError(f"MODEL={config.model!r} cannot be built for DATASET={config.dataset!r} (inputs of shape "
                          f"{task.input_shape}, {task.output_size} outputs): {type(error).__name__}: {message}. Fix "
                          f"its gin bindings ({config.model}.<argument>=...), or use a model built for this kind of "
                          f"input{f' (these build for it: {fitting})' if fitting else ''}.") from error


_BUILD_ERRORS = (ValueError, TypeError, IndexError, KeyError)


def _models_that_build(task, bound: BoundArguments, *, exclude: str) -> list[str]:
    """The other registered models that build for `task` as configured (tried one by one: only on the error path)."""
    fitting = []
    for name, builder in MODELS.items():
        if name == exclude or _mismatch(name, builder, task.model_options(), bound) != ([], []):
            continue
        try:
            builder(task.input_shape, task.output_size, **task.model_options())
        except _BUILD_ERRORS:
            continue
        fitting.append(name)
    return fitting


def _mismatch(name: str, builder, options: dict, bound: BoundArguments) -> tuple[list[str], list[str]]:
    """(options the builder does not take, keyword arguments it needs that neither `options` nor `bound` give)."""
    parameters = list(inspect.signature(builder).parameters.values())
    if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
        return [], []
    unexpected = [option for option in options if option not in {parameter.name for parameter in parameters}]
    elsewhere = set(bound(name))
    missing = [parameter.name for parameter in parameters[2:]  # After (input_shape, num_classes).
               if parameter.default is parameter.empty and parameter.name not in options
               and parameter.name not in elsewhere]
    return unexpected, missing
