"""The gin edge: `experiment` (ExperimentConfig) is the root configurable, and `run` executes one mode of it.

train.py parses the gin files and bindings, then calls `run`. Library code below this module takes plain
arguments and never reads gin.
"""

import logging

import gin

from tpu_utils.strategy import make_strategy
from training.config import ExperimentConfig
from training.controller import Controller
from training.run_directory import RunDirectory
from training.trainer import Trainer

log = logging.getLogger(__name__)

experiment = gin.external_configurable(ExperimentConfig, name="experiment")


def run(*, model_dir: str, mode: str = "train", command: str = "") -> dict:
    """Builds the configured experiment and runs `mode` ('train', 'eval' or 'export'); returns its metrics.

    `command` (the exact command line) is recorded in model_dir/command.txt.
    """
    config = experiment()  # All fields come from gin (configs/base.gin binds them to the contract's macros).
    strategy = make_strategy(config.strategy, virtual_devices=config.virtual_devices, tpu=config.tpu)
    log.info("Strategy %s with %d replica(s); model_dir %s", type(strategy).__name__, strategy.num_replicas_in_sync,
             model_dir)
    trainer = Trainer(config, strategy)
    run_dir = RunDirectory(model_dir)
    controller = Controller(trainer, run_dir)
    if mode == "train":
        controller.restore()
        run_dir.write_text("command.txt", command + "\n")
        run_dir.write_text("operative_config.gin", gin.operative_config_str())
        return controller.train_and_evaluate()
    controller.restore_for_inference()
    if mode == "eval":
        return controller.evaluate()
    return {"step": trainer.step, "export": controller.export()}
