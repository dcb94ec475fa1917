"""The gin edge: `experiment` (ExperimentConfig) is the root configurable, and `run` executes one mode of it.

train.py parses the gin files and bindings, then calls `run`. Library code below this module takes plain
arguments and never reads gin.
"""

import inspect
import logging

import gin

from common.errors import ConfigError, StorageError
from common.extras import check_gcs_paths
from common.storage_errors import transient
from data import service
from models.registry import get_model_builder
from tpu_utils.strategy import input_hosts, is_chief, make_strategy
from training import preflight as preflight_module
from training import stop_signals
from training.config import ExperimentConfig
from training.controller import ContinuousEvalSettings, Controller
from training.observers.profiling import check_port_free
from training.run_directory.layout import SIDECAR, RunDirectory
from training.run_directory.record import RunRecord, keeps_best
from training.run_directory.storage_guard import StorageGuard
from training.trainer import Trainer

log = logging.getLogger(__name__)

experiment = gin.external_configurable(ExperimentConfig, name="experiment")
continuous_eval_settings = gin.external_configurable(ContinuousEvalSettings, name="continuous_eval")


def run(*, model_dir: str, mode: str = "train", command: str = "") -> dict:
    """Builds the configured experiment and runs `mode` ('train', 'eval', 'export' or 'continuous_eval': the sidecar
    evaluator, a mode of training/controller.py); returns its metrics.

    `command` (the exact command line) is recorded in model_dir/command.txt. A stop requested by SIGTERM/SIGINT
    before training ends the run (exit 3) before anything is written; the run lock is taken before the first write
    (the sidecar's is eval_sidecar/run.lock: never the training job's).
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
    directory = RunDirectory(model_dir, is_chief=is_chief(strategy),
                             guard=StorageGuard(timeout_seconds=config.storage_timeout_seconds))
    if mode == "train" and directory.is_chief:  # Taken now: refused before the data and the model are built.
        check_port_free(config.profiler_port)
    if mode == "train" and config.best_metric and not keeps_best(config, mode):
        log.info("BEST_METRIC=%r with EVAL_EVERY=0: best/ and export/best/ are kept by the sidecar evaluator "
                 "(--mode=continuous_eval, docs/sidecar_eval.md), not by this job.", config.best_metric)
    held = directory.folder(SIDECAR) if mode == "continuous_eval" else directory
    try:
        with held.locked(optional=mode == "eval") as writable:
            stop_signals.stop_if_requested("before training started")
            wanted = service.parse(config.data_service) if mode == "train" else service.ServiceSetting()
            waiting = {"timeout_seconds": config.storage_timeout_seconds, "input_hosts": input_hosts(strategy),
                       "check_stop": lambda: stop_signals.stop_if_requested("before training started")}
            with service.started(wanted, **waiting) as input_services:
                trainer = Trainer(config, strategy, training=mode == "train", bound_arguments=bound_model_arguments,
                                  input_services=input_services)
                record = RunRecord(trainer, directory, role=mode, model_settings=model_settings(config.model))
                controller = Controller(trainer, record)
                stop_signals.stop_if_requested("before training started")
                return _run_mode(mode, controller, writable=writable, command=command, settings=settings)
    finally:
        directory.cleanup()


def _run_mode(mode: str, controller: Controller, *, writable: bool, command: str, settings) -> dict:
    record = controller.record
    if mode == "continuous_eval":
        return controller.evaluate_continuously(settings)
    if mode == "train":
        record.restore()
        stop_signals.stop_if_requested("before training started")
        record.write_start(command=command, operative_config=gin.operative_config_str())
        return controller.train_and_evaluate()
    record.restore_for_inference(writable=writable)
    if mode == "eval":
        return controller.evaluate_once(recorded=writable)
    try:
        return {"step": controller.trainer.step, "export": record.export()}
    except StorageError as error:  # Nothing trained: the storage is the input that is wrong ...
        if transient(error) or not record.directory.guard.writable:  # ... unless it is down, or the lock lost.
            raise
        raise ConfigError(str(error)) from error


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
