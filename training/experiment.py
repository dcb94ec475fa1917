"""The gin edge: `experiment` (ExperimentConfig) is the root configurable, and `run` executes one mode of it.

train.py parses the gin files and bindings, then calls `run`. Library code below this module takes plain
arguments and never reads gin.
"""

import logging

import gin

from tpu_utils.strategy import is_chief, make_strategy
from training import preflight as preflight_module
from training.config import ExperimentConfig
from training.controller import Controller
from training.gcs_preflight import check_gcs_paths
from training.run_directory import RunDirectory
from training.trainer import Trainer

log = logging.getLogger(__name__)

experiment = gin.external_configurable(ExperimentConfig, name="experiment")


def run(*, model_dir: str, mode: str = "train", command: str = "") -> dict:
    """Builds the configured experiment and runs `mode` ('train', 'eval' or 'export'); returns its metrics.

    `command` (the exact command line) is recorded in model_dir/command.txt.
    """
    config = experiment()  # All fields come from gin (configs/base.gin binds them to the contract's macros).
    # Buckets first: a missing or read-only bucket must not cost a TPU start-up or a training loop.
    check_gcs_paths({"DATA_DIR": config.data_dir, "model_dir": model_dir}, tpu_zone=config.tpu_zone)
    strategy = make_strategy(config.strategy, virtual_devices=config.virtual_devices, tpu=config.tpu,
                             startup_timeout_seconds=config.startup_timeout_seconds)
    log.info("Strategy %s with %d replica(s); model_dir %s", type(strategy).__name__, strategy.num_replicas_in_sync,
             model_dir)
    if config.target_replicas and config.target_replicas != strategy.num_replicas_in_sync:
        log.warning("This config is written for %d replicas and runs on %d: same global batch and learning rate, so "
                    "the result should match, but the per-replica batch and speed differ.", config.target_replicas,
                    strategy.num_replicas_in_sync)
    trainer = Trainer(config, strategy, training=mode == "train")
    run_dir = RunDirectory(model_dir, is_chief=is_chief(strategy))
    controller = Controller(trainer, run_dir)
    try:
        if mode == "train":
            controller.restore()
            run_dir.write_text("command.txt", command + "\n")
            run_dir.write_text("operative_config.gin", gin.operative_config_str())
            return controller.train_and_evaluate()
        controller.restore_for_inference()
        if mode == "eval":
            return controller.evaluate()
        return {"step": trainer.step, "export": controller.export()}
    finally:
        run_dir.cleanup()


def preflight(*, model_dir: str) -> bool:
    """Checks the configured experiment on this machine's CPU (training/preflight.py); prints a report."""
    config = experiment()
    checks = preflight_module.run_preflight(config, model_dir)
    print(preflight_module.report(checks, config), flush=True)
    return not any(check.problem for check in checks)
