"""The host loop: the only code that decides when to log, evaluate, checkpoint, summarise and export.

Between two on-device loops of STEPS_PER_LOOP steps it: checks the loss is finite (else exit 4 with the newest
checkpoint on disk as the last good one), logs step/loss/accuracy/examples per second, writes TensorBoard
summaries, evaluates every EVAL_EVERY steps (rewriting metrics.json), checkpoints every CHECKPOINT_EVERY steps, and
honours SIGTERM/SIGINT (checkpoint, then exit 3). At the end it evaluates, checkpoints and exports.
"""

import contextlib
import logging
import math
import signal
import time

import tensorflow as tf

from tpu_utils.loop import make_any_worker, replica_disagreement
from tpu_utils.strategy import io_device_for, is_multi_worker
from training.errors import ConfigError, NonFiniteLossError, StorageError, TrainingInterrupted
from training.export import export_saved_model
from training.run_directory import RunDirectory
from training.trainer import Trainer

log = logging.getLogger(__name__)

REPLICA_TOLERANCE = 1e-5  # The contract's replica-invariance tolerance in float32.


class Controller:
    """Runs a Trainer to TRAIN_STEPS with the bookkeeping of the run directory."""

    def __init__(self, trainer: Trainer, run_dir: RunDirectory):
        self.trainer = trainer
        self.run_dir = run_dir
        self.config = trainer.config
        # Non-chief workers save to a temporary folder (they must save too) and resume from the chief's checkpoints.
        self.manager = tf.train.CheckpointManager(trainer.checkpoint, run_dir.checkpoint_write_dir,
                                                  max_to_keep=self.config.checkpoints_to_keep,
                                                  step_counter=trainer.global_step)
        self._checkpoint_options = tf.train.CheckpointOptions(
            experimental_io_device=io_device_for(trainer.strategy, run_dir.checkpoint_write_dir))
        self._stop_signal = None
        # Multi-worker: a stop requested on one worker is honoured by all of them at the same loop boundary.
        self._any_worker = make_any_worker(trainer.strategy) if is_multi_worker(trainer.strategy) else bool
        self._saved_step = None  # Step of the newest checkpoint this process wrote or restored.
        self._writers = {}
        self._train_metrics = {}  # Of the last training loop; metrics.json's "train" part.

    def _writer(self, name: str):
        """TensorBoard writer for model_dir/<name>, made once (one events file per run); a no-op off the chief."""
        if name not in self._writers:
            self._writers[name] = tf.summary.create_file_writer(self.run_dir.path(name)) if self.run_dir.is_chief \
                else tf.summary.create_noop_writer()
        return self._writers[name]

    def _write_summaries(self, name: str, step: int, values: dict) -> None:
        """TensorBoard scalars under model_dir/<name>. Best effort: if the storage fails (e.g. GCS unreachable), warn
        and go on; checkpoints and metrics.json are what a run cannot lose, and they raise StorageError."""
        try:
            with self._writer(name).as_default(step=step):
                for tag, value in values.items():
                    tf.summary.scalar(tag, value)
        except tf.errors.OpError as error:
            log.warning("TensorBoard events for %s/ at step %d not written (%s); training goes on.", name, step,
                        " ".join(error.message.split())[:200])

    def _save(self, step: int) -> None:
        if step == self._saved_step:
            return
        try:
            self.manager.save(checkpoint_number=step, options=self._checkpoint_options)
        except tf.errors.OpError as error:  # e.g. GCS unreachable: the checkpoint index still names the last good one.
            raise StorageError(f"Saving the checkpoint of step {step} to {self.manager.directory} failed "
                               f"({type(error).__name__}: {' '.join(error.message.split())[:300]}). The previous "
                               f"checkpoint ({self.manager.latest_checkpoint or 'none'}) is intact: rerun the same "
                               "command to resume from it once the storage is reachable.") from error
        self._saved_step = step

    def _latest_checkpoint(self) -> str | None:
        return tf.train.latest_checkpoint(self.run_dir.checkpoint_dir)  # The chief's, which every worker resumes.

    def restore(self) -> int:
        """Restores the latest checkpoint if there is one (after checking it belongs to this run); returns the step."""
        latest = self._latest_checkpoint()
        self.run_dir.check_identity(self.config.identity(), has_checkpoint=latest is not None)
        if latest:
            self.trainer.restore(latest)
            self._saved_step = self.trainer.step
            log.info("Resumed from %s at step %d.", latest, self.trainer.step)
        return self.trainer.step

    def restore_for_inference(self) -> int:
        """Restores the latest checkpoint for --mode=eval/export; a ConfigError if there is none."""
        if not self._latest_checkpoint():
            raise ConfigError(f"No checkpoint in {self.run_dir.checkpoint_dir}: train first (--mode=train) or pass "
                              "the --model_dir of a trained run.")
        return self.restore()

    def train_and_evaluate(self) -> dict:
        """Trains from the current step to TRAIN_STEPS; returns the final {'step', 'train', 'eval'} metrics."""
        config, trainer = self.config, self.trainer
        if trainer.step >= config.train_steps:
            log.info("Step %d >= TRAIN_STEPS=%d: nothing to train (raise TRAIN_STEPS to continue).", trainer.step,
                     config.train_steps)
        else:
            iterator = trainer.train_iterator()
            with self._catch_stop_signals():
                while trainer.step < config.train_steps:
                    self._run_one_loop(iterator)
                    step = trainer.step
                    if step == config.train_steps:
                        break
                    if config.eval_every and step % config.eval_every == 0:
                        self.evaluate()
                    if self._any_worker(self._stop_signal is not None):
                        self._save(step)
                        cause = signal.Signals(self._stop_signal).name if self._stop_signal else "another worker"
                        raise TrainingInterrupted(f"Stopped by {cause} at step {step}; checkpoint saved. Rerun the "
                                                  "same command to resume.")
                    if config.checkpoint_every and step % config.checkpoint_every == 0:
                        self._save(step)
        final = self.evaluate()
        self._save(trainer.step)
        self.export()
        self._check_replicas_agree()
        return final

    def evaluate(self) -> dict:
        """Exact evaluation now; logs it, writes eval summaries and metrics.json."""
        started = time.perf_counter()
        evaluation = self.trainer.evaluate()
        step = self.trainer.step
        log.info("eval step %d | %s | %.1f s", step, _format(evaluation), time.perf_counter() - started)
        self._write_summaries("eval", step, evaluation)
        if not self._train_metrics:  # --mode=eval, or nothing left to train: keep the recorded training figures.
            self._train_metrics = (self.run_dir.read_json("metrics.json") or {}).get("train", {})
        self.run_dir.write_metrics(step, self._train_metrics, evaluation)
        return {"step": step, "train": self._train_metrics, "eval": evaluation}

    def export(self) -> str:
        path = self.run_dir.export_dir(self.trainer.step)  # Every worker exports; only the chief's is kept.
        export_saved_model(self.trainer.model, self.trainer.task, path,
                           io_device=io_device_for(self.trainer.strategy, path))
        if self.run_dir.is_chief:
            log.info("Exported SavedModel to %s", path)
        return path

    def _check_replicas_agree(self) -> None:
        """Synchronous training keeps every replica's weights equal, on every worker; measures it once at the end."""
        strategy = self.trainer.strategy
        if strategy.num_replicas_in_sync == 1:
            return
        disagreement = replica_disagreement(strategy, self.trainer.model.variables)
        report = log.info if disagreement <= REPLICA_TOLERANCE else log.warning
        report("Replica weights: the %d replicas' copies differ by at most %.1e (relative; tolerance %.0e).",
               strategy.num_replicas_in_sync, disagreement, REPLICA_TOLERANCE)

    def _run_one_loop(self, iterator) -> None:
        config, trainer = self.config, self.trainer
        num_steps = min(config.steps_per_loop, config.train_steps - trainer.step)
        started = time.perf_counter()
        metrics = trainer.train(iterator, num_steps)
        seconds = time.perf_counter() - started
        step = trainer.step
        if not math.isfinite(metrics["loss"]):
            raise NonFiniteLossError(f"Loss became {metrics['loss']} between steps {step - num_steps} and {step}; "
                                     "nothing was saved since. The newest checkpoint on disk "
                                     f"({self._latest_checkpoint() or 'none yet'}) is the last good one. Lower "
                                     "LEARNING_RATE or set experiment.clip_global_norm, then rerun to resume from it.")
        metrics["examples_per_second"] = num_steps * config.global_batch_size / seconds
        learning_rate = float(tf.convert_to_tensor(trainer.optimizer.learning_rate).numpy())
        log.info("step %*d/%d | %s | lr %.4g", len(str(config.train_steps)), step, config.train_steps,
                 _format(metrics), learning_rate)
        self._write_summaries("train", step, {**metrics, "learning_rate": learning_rate})
        self._train_metrics = {key: value for key, value in metrics.items() if key != "examples_per_second"}

    @contextlib.contextmanager
    def _catch_stop_signals(self):
        """SIGTERM/SIGINT set a flag that the loop honours at the next loop boundary; a second signal stops at once."""

        def handler(signum, frame):
            if self._stop_signal is not None:
                raise KeyboardInterrupt
            self._stop_signal = signum
            log.warning("%s received: stopping after the current loop.", signal.Signals(signum).name)

        previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for signum, old in previous.items():
                signal.signal(signum, old)


def _format(metrics: dict) -> str:
    return " | ".join(f"{name.replace('_', ' ')} {value:,.0f}" if name == "examples_per_second" else
                      f"{name} {value:.4f}" for name, value in metrics.items())
