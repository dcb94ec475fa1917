"""The gin edge: `experiment` (ExperimentConfig) is the root configurable, and `run` executes one mode of it.

train.py parses the gin files and bindings, then calls `run`. Library code below this module takes plain
arguments and never reads gin.
"""

import contextlib
import inspect
import logging
import time

import gin

from common.errors import ConfigError, StorageError
from common.extras import check_gcs_paths
from common.storage_errors import transient
from models.registry import get_model_builder
from tpu_utils.strategy import is_chief, make_strategy
from training import continuous_eval, stop_signals
from training import preflight as preflight_module
from training.config import ExperimentConfig
from training.controller import Controller
from training.observers.profiling import check_port_free
from training.run_directory import identity as run_identity
from training.run_directory import lock as run_lock
from training.run_directory.layout import RunDirectory
from training.run_directory.storage_guard import StorageGuard
from training.trainer import Trainer

log = logging.getLogger(__name__)

experiment = gin.external_configurable(ExperimentConfig, name="experiment")
continuous_eval_settings = gin.external_configurable(continuous_eval.ContinuousEvalSettings, name="continuous_eval")


def run(*, model_dir: str, mode: str = "train", command: str = "") -> dict:
    """Builds the configured experiment and runs `mode` ('train', 'eval', 'export' or 'continuous_eval': the sidecar
    evaluator, training/continuous_eval.py); returns its metrics.

    `command` (the exact command line) is recorded in model_dir/command.txt. A stop requested by SIGTERM/SIGINT
    before training ends the run (exit 3) before anything is written; the run lock is taken before the first write.
    """
    stop_signals.stop_if_requested("before training started")
    config = experiment()  # All fields come from gin (configs/base.gin binds them to docs/configuration.md's macros).
    settings = continuous_eval_settings() if mode == "continuous_eval" else None  # A bad value: exit 2 now.
    # Buckets first: a missing or read-only bucket must not cost a TPU start-up or a training loop.
    check_gcs_paths({"DATA_DIR": config.data_dir, "model_dir": model_dir}, tpu_zone=config.tpu_zone,
                    timeout_seconds=config.storage_timeout_seconds)
    stop_signals.stop_if_requested("before training started")
    strategy = make_strategy(config.strategy, virtual_devices=config.virtual_devices, tpu=config.tpu,
                             startup_timeout_seconds=config.startup_timeout_seconds)
    stop_signals.reclaim()  # MultiWorkerMirroredStrategy replaces the SIGTERM handler with its own.
    log.info("Strategy %s with %d replica(s); model_dir %s", type(strategy).__name__, strategy.num_replicas_in_sync,
             model_dir)
    if config.target_replicas and config.target_replicas != strategy.num_replicas_in_sync:
        log.warning("This config is written for %d replicas and runs on %d: same global batch and learning rate, so "
                    "the result should match, but the per-replica batch and speed differ.", config.target_replicas,
                    strategy.num_replicas_in_sync)
    run_dir = RunDirectory(model_dir, is_chief=is_chief(strategy),
                           guard=StorageGuard(timeout_seconds=config.storage_timeout_seconds))
    if mode == "train" and run_dir.is_chief:  # Taken now: refused before the data and the model are built.
        check_port_free(config.profiler_port)
    if mode == "train" and continuous_eval.keeps_best(config):
        log.info("BEST_METRIC=%r with EVAL_EVERY=0: best/ and export/best/ are kept by the sidecar evaluator "
                 "(--mode=continuous_eval, docs/sidecar_eval.md), not by this job.", config.best_metric)
    if mode == "continuous_eval":  # Never the training job's lock: the sidecar holds eval_sidecar/run.lock.
        return _continuous_eval(config, strategy, run_dir, settings)
    with _lock_for(mode, run_dir) as writable:
        try:
            stop_signals.stop_if_requested("before training started")
            trainer = Trainer(config, strategy, training=mode == "train", bound_arguments=bound_model_arguments)
            controller = Controller(trainer, run_dir, model_settings=model_settings(config.model))
            stop_signals.stop_if_requested("before training started")
            if mode == "train":
                controller.restore()
                stop_signals.stop_if_requested("before training started")
                controller.record_identity()
                run_dir.write_text("command.txt", command + "\n")
                run_dir.write_text("operative_config.gin", gin.operative_config_str())
                return controller.train_and_evaluate()
            controller.restore_for_inference(writable=writable)
            if mode == "eval":
                return _evaluate(controller, recorded=writable)
            try:
                return {"step": trainer.step, "export": controller.export()}
            except StorageError as error:  # Nothing trained: the storage is the input that is wrong ...
                if transient(error) or not run_dir.guard.writable:  # ... unless it is down, or the lock lost.
                    raise
                raise ConfigError(str(error)) from error
        finally:
            run_dir.cleanup()


@contextlib.contextmanager
def _lock_for(mode: str, run_dir: RunDirectory):
    """Yields whether this process may write model_dir: the chief holds the run lock for the body. --mode=eval on a
    model_dir it cannot write, or that a training run holds, still evaluates and prints the metrics (without
    recording them)."""
    lock = run_lock.make_lock(run_dir.model_dir, storage_timeout_seconds=run_dir.guard.timeout_seconds) \
        if run_dir.is_chief else None
    if lock is not None:
        try:
            lock.acquire()
        except ConfigError as error:  # Held by a training run, or not writable.
            if mode != "eval":
                raise
            log.warning("%s Evaluating without recording metrics.json.", error)
            lock = None
    if lock is not None:
        run_dir.guard.lock = lock  # Every write asks it first: a gs:// lock can be lost mid-run.
    try:
        yield lock is not None or not run_dir.is_chief
    finally:
        if lock is not None:
            lock.release()


def _continuous_eval(config, strategy, run_dir: RunDirectory, settings) -> dict:
    """--mode=continuous_eval: evaluates each new checkpoint of model_dir once (training/continuous_eval.py)."""
    try:
        trainer = Trainer(config, strategy, training=False, bound_arguments=bound_model_arguments)
        identity = run_identity.run_identity(config, model_settings(config.model),
                                             data=run_identity.data_identity(trainer.builder))
        return continuous_eval.run_sidecar(trainer, run_dir, settings, identity=identity)
    finally:
        run_dir.cleanup()


def _evaluate(controller: Controller, *, recorded: bool) -> dict:
    """--mode=eval: evaluates once; a failure to record it is a warning (the metrics were printed), not a rerun."""
    started = time.perf_counter()
    result = controller.evaluate(record=False)
    if not recorded:
        return result
    try:
        return controller.record_evaluation(result["step"], result["eval"], time.perf_counter() - started)
    except StorageError as error:
        log.warning("%s The metrics above were computed but not recorded.", error)
        return result


def model_settings(model_name: str) -> dict:
    """{'cnn.filters': (32, 64), ...}: the model builder's keyword arguments as gin binds them (else defaults).
    Called after the Trainer is built, which has already rejected an unknown MODEL."""
    builder = get_model_builder(model_name)
    name = getattr(builder, "__name__", model_name)
    defaults = {key: parameter.default for key, parameter in inspect.signature(builder).parameters.items()
                if parameter.default is not inspect.Parameter.empty}
    return {f"{name}.{key}": value for key, value in {**defaults, **gin.get_bindings(builder)}.items()}


def bound_model_arguments(model_name: str) -> frozenset[str]:
    """The keyword arguments of MODEL `model_name`'s builder that gin binds (`transformer.vocab_size=100`), for the
    Trainer's check that a model gets every argument it needs."""
    try:
        return frozenset(gin.get_bindings(get_model_builder(model_name)))
    except (ConfigError, ValueError):  # An unknown MODEL (the Trainer names it), or a builder gin does not know.
        return frozenset()


def preflight(*, model_dir: str) -> bool:
    """Checks the configured experiment on this machine's CPU (training/preflight.py); prints a report."""
    config = experiment()
    checks = preflight_module.run_preflight(config, model_dir, bound_arguments=bound_model_arguments)
    print(preflight_module.report(checks, config), flush=True)
    return not any(check.problem for check in checks)
