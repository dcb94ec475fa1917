"""Training throughput of the template against Keras `fit` and the TF guide loop, in one process, interleaved.

    python bench/throughput.py                       # every model at batch 64 and 256, 1 replica: ~10 minutes
    python bench/throughput.py --models=cnn,mlp --batches=64 --replicas=2 --repetitions=5 --output=/tmp/t.json

For each model and global batch it measures examples/s of:
  template SPL=N   the template's Trainer.train (input + on-device loop) at STEPS_PER_LOOP 1, 10, 100, with the
                   train split on the devices where the Trainer keeps it there (data/device_split.py: digits does);
  template SPL=100, tf.data   the same from the tf.data pipeline instead (only where the split is on the devices);
  pipeline         the template's tf.data input pipeline alone (distributed iterator drained from Python, one
                   `next` per step: what the TF guide loop sees);
  pipeline, compiled drain   the same iterator drained inside a compiled loop, as the template's loop consumes it;
  on-device batches  the batches drawn on the devices alone, in a compiled loop (where the split is there);
  fixed batch      the template's on-device loop fed one batch over and over (the compute bound);
  keras fit        Keras 3 `fit(steps_per_execution=100)` on the same model, optimizer and batch, from in-memory
                   tensors, and from the template's own tf.data pipeline;
  guide loop       the TF distributed-training guide's loop (one `strategy.run` per Python step);
  XLA              the template with experiment.jit_compile='on' (training/jit_compile.py: each step's forward and
                   backward pass compiled by XLA), at SPL=100 and on the fixed batch, against the same with 'off'
                   (the rows above), at any replica count (the benchmark's models keep BatchNormalization
                   unsynchronized, which XLA can hold at 2+ replicas); and Keras `fit(jit_compile=True)` at 1
                   replica (XLA on both sides of that ratio; Keras' XLA step fails at 2+ replicas on CPU).
  XLA, tf.data     the XLA loop fed by the tf.data pipeline instead of the split on the devices (where it is there).
  --xla_only       only the columns that decide experiment.jit_compile='auto': template SPL=100 and fixed batch,
                   with and without XLA (and XLA fed by tf.data).
Per case also: seconds for one exact evaluation of the eval split and for one checkpoint save (written and read
back, as training does), median of the repetitions.
Repetitions are interleaved (every column once per round), so load changes hit all columns alike; the table gives
the median and the JSON also min and max, with the load average before and after. Same digits data, same SGD,
float32; XLA only in the XLA columns, on both sides of their ratios. Also: time to first step of
`python train.py` (a subprocess, by phase), and the RSS growth of a long run (--rss_steps).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from throughput_table import table  # noqa: E402 - bench/ is on the path when run as a script.

MODELS = {  # name -> (gin file, extra bindings)
    "cnn": ("configs/default.gin", []),
    "mlp": ("configs/experiments/digits_mlp.gin", []),
    "cnn_wide": ("configs/default.gin", ["cnn.filters=(64, 128)", "cnn.dense_units=256"]),
    "resnet20": ("configs/default.gin", ["MODEL='resnet'", "resnet.depth=20"]),
}
STEPS = 300  # per timed block (steps_per_loop divides it); --steps


def _config(model: str, batch: int, replicas: int):
    from training import config_files, experiment

    gin_file, bindings = MODELS[model]
    params = [*bindings, f"GLOBAL_BATCH_SIZE={batch}", "experiment.lr_schedule='constant'", "TRAIN_STEPS=1000000",
              "CHECKPOINT_EVERY=0", "EVAL_EVERY=0", "STEPS_PER_LOOP=100"]
    if replicas > 1:
        params += ["STRATEGY='mirrored'", f"VIRTUAL_DEVICES={replicas}"]
    config_files.parse([gin_file], params, search_path=config_files.REPO_ROOT)
    return experiment.experiment()


class Case:
    """Everything built once for one (model, batch, replicas); each column measures examples/s when called."""

    def __init__(self, model: str, batch: int, replicas: int, *, xla_only: bool = False):
        import dataclasses

        import keras
        import tensorflow as tf

        from tpu_utils.strategy import make_strategy
        from training.trainer import Trainer

        self.batch = batch
        config = _config(model, batch, replicas)
        strategy = make_strategy(config.strategy, virtual_devices=config.virtual_devices)
        self.trainer = Trainer(config, strategy)
        # The product's XLA path (experiment.jit_compile='on'), trained from the same weights on the same data.
        self.xla_trainer = Trainer(dataclasses.replace(config, jit_compile="on"), strategy)
        self.xla_trainer.model.set_weights(self.trainer.model.get_weights())
        self.xla_iterator = self.xla_trainer.train_iterator()
        self.xla_data_iterator = iter(strategy.distribute_datasets_from_function(self.xla_trainer.train_input_fn()))
        self.xla_only = xla_only
        self.iterator = self.trainer.train_iterator()  # The split on the devices where the Trainer uses it.
        self.data_iterator = iter(strategy.distribute_datasets_from_function(self.trainer.train_input_fn()))
        first = next(iter(self.trainer.train_input_fn()(tf.distribute.InputContext())))
        fixed = tf.data.Dataset.from_tensors(first).repeat()
        self.fixed_iterator = iter(strategy.experimental_distribute_dataset(fixed.unbatch().batch(batch)))
        self.pipeline_iterator = iter(strategy.distribute_datasets_from_function(self.trainer.train_input_fn()))
        self._draw = self._make_draw(tf)
        self.drained_iterator = iter(strategy.distribute_datasets_from_function(self.trainer.train_input_fn()))
        # Keras fit: the same builder, optimizer and batch; in-memory preprocessed arrays of the same examples.
        features, labels, _ = (tensor.numpy() for tensor in first)
        count = 100 * batch  # One epoch = one execution of steps_per_execution=100 steps.
        repeats = -(-count // len(features))
        self.arrays = (features.repeat(repeats, axis=0)[:count], labels.repeat(repeats, axis=0)[:count])
        with strategy.scope():
            self.keras_model = keras.models.clone_model(self.trainer.model)
            self.keras_model.compile(optimizer=keras.optimizers.SGD(config.learning_rate, momentum=0.9),
                                     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                     metrics=["accuracy"], steps_per_execution=100, jit_compile=False)
            if replicas == 1:
                self.keras_xla_model = keras.models.clone_model(self.trainer.model)
                self.keras_xla_model.compile(optimizer=keras.optimizers.SGD(config.learning_rate, momentum=0.9),
                                             loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                             metrics=["accuracy"], steps_per_execution=100, jit_compile=True)
        self.replicas = replicas
        self.strategy = strategy
        self._guide_step = self._make_guide_step(tf)

    def _make_guide_step(self, tf):
        trainer = self.trainer

        @tf.function
        def guide_step(iterator):
            trainer.strategy.run(trainer.train_step, args=(next(iterator),))

        return guide_step

    def _make_draw(self, tf):
        """A compiled loop that only draws STEPS steps of batches from a source (the on-device split, or a distributed
        iterator of the tf.data pipeline), the way the training loop consumes them (tpu_utils/loop.py)."""
        from tpu_utils import loop

        strategy = self.trainer.strategy

        def first_values(batch):  # One number per replica batch, so the draw is not pruned away.
            features = batch[0]
            return tf.reduce_sum(tf.cast(features[..., :1], tf.float32))

        @tf.function
        def draw(source, first_step):
            total = tf.constant(0.0)
            for index in tf.range(STEPS):
                values = loop.run_on_next_batch(strategy, first_values, source, first_step + tf.cast(index, tf.int64))
                total += strategy.reduce("SUM", values, axis=None)
            return total

        return draw

    def template(self, steps_per_loop: int, iterator=None, trainer=None) -> float:
        started = time.perf_counter()
        for _ in range(STEPS // steps_per_loop):
            (trainer or self.trainer).train(iterator or self.iterator, steps_per_loop)
        return STEPS * self.batch / (time.perf_counter() - started)

    def draw(self, source) -> float:
        import tensorflow as tf

        started = time.perf_counter()
        self._draw(source, tf.constant(self.trainer.step, tf.int64)).numpy()
        return STEPS * self.batch / (time.perf_counter() - started)

    def pipeline(self) -> float:
        started = time.perf_counter()
        for _ in range(STEPS):
            next(self.pipeline_iterator)
        return STEPS * self.batch / (time.perf_counter() - started)

    def fixed_batch(self, trainer=None) -> float:
        import tensorflow as tf

        started = time.perf_counter()
        (trainer or self.trainer)._train_loop(self.fixed_iterator, tf.constant(STEPS, tf.int32))["loss"].numpy()
        return STEPS * self.batch / (time.perf_counter() - started)

    def keras_fit_in_memory(self, model=None) -> float:
        features, labels = self.arrays
        epochs = max(1, STEPS * self.batch // len(features))
        started = time.perf_counter()
        (model or self.keras_model).fit(features, labels, batch_size=self.batch, epochs=epochs, verbose=0,
                                        shuffle=False)
        return epochs * len(features) / (time.perf_counter() - started)

    def eval_seconds(self) -> float:
        started = time.perf_counter()
        self.trainer.evaluate()
        return time.perf_counter() - started

    def checkpoint_seconds(self) -> float:
        """One save as training does it: written, read back and verified, older ones rotated (a local folder)."""
        import tempfile

        from training.run_directory.checkpoints import CheckpointStore

        with tempfile.TemporaryDirectory() as directory:
            store = CheckpointStore(self.trainer.checkpoint, read_dir=directory, write_dir=directory, keep=1)
            started = time.perf_counter()
            store.save(self.trainer.step)
            return time.perf_counter() - started

    def keras_fit_pipeline(self) -> float:
        dataset = self.trainer.train_input_fn()
        import tensorflow as tf

        def input_fn(context):
            return dataset(context).map(lambda features, labels, positions: (features, labels))

        data = self.strategy.distribute_datasets_from_function(input_fn) if self.strategy.num_replicas_in_sync > 1 \
            else input_fn(tf.distribute.InputContext())
        started = time.perf_counter()
        self.keras_model.fit(data, steps_per_epoch=STEPS, epochs=1, verbose=0)
        return STEPS * self.batch / (time.perf_counter() - started)

    def guide_loop(self) -> float:
        started = time.perf_counter()
        for _ in range(STEPS):
            self._guide_step(self.data_iterator)
        return STEPS * self.batch / (time.perf_counter() - started)

    def columns(self) -> dict:
        xla = {"template SPL=100, XLA": lambda: self.template(100, self.xla_iterator, self.xla_trainer),
               "fixed batch, XLA": lambda: self.fixed_batch(self.xla_trainer)}
        if self.trainer.train_data_on_device:  # The compiled loop drawing on the devices, against it fed by tf.data.
            xla["template SPL=100, XLA, tf.data"] = lambda: self.template(100, self.xla_data_iterator,
                                                                          self.xla_trainer)
        if self.xla_only:
            return {"template SPL=100": lambda: self.template(100), "fixed batch": self.fixed_batch, **xla}
        columns = {"template SPL=1": lambda: self.template(1), "template SPL=10": lambda: self.template(10),
                   "template SPL=100": lambda: self.template(100), "pipeline": self.pipeline,
                   "pipeline, compiled drain": lambda: self.draw(self.drained_iterator),
                   "fixed batch": self.fixed_batch, "keras fit (in memory)": self.keras_fit_in_memory,
                   "keras fit (pipeline)": self.keras_fit_pipeline, "guide loop": self.guide_loop}
        if self.trainer.train_data_on_device:  # The default here; against the tf.data pipeline it replaces.
            columns["template SPL=100, tf.data"] = lambda: self.template(100, self.data_iterator)
            columns["on-device batches"] = lambda: self.draw(self.iterator)
        columns.update(xla)
        if self.replicas == 1:
            columns["keras fit (in memory), XLA"] = lambda: self.keras_fit_in_memory(self.keras_xla_model)
        return columns

    def timings(self) -> dict:
        """Seconds (not examples/s): one exact evaluation, one checkpoint save."""
        if self.xla_only:
            return {}
        return {"eval seconds": self.eval_seconds, "checkpoint seconds": self.checkpoint_seconds}


def measure(case: Case, repetitions: int) -> dict:
    columns = {**case.columns(), **case.timings()}
    for measure_once in columns.values():  # Trace and warm up every column first.
        measure_once()
    samples = {name: [] for name in columns}
    for _ in range(repetitions):
        for name, measure_once in columns.items():
            samples[name].append(measure_once())
    return {name: {"median": statistics.median(values), "min": min(values), "max": max(values)}
            for name, values in samples.items()}


def time_to_first_step() -> dict:
    """Seconds by phase of `python train.py`'s start, in a fresh process (TF import, dataset, model, first loop)."""
    script = r"""
import json, time, sys
started = time.perf_counter()
import tensorflow, keras, tensorflow_datasets
imported = time.perf_counter()
sys.path.insert(0, ".")
from training import config_files, experiment
from tpu_utils.strategy import make_strategy
from training.trainer import Trainer
config_files.parse(["configs/default.gin"], [], search_path=config_files.REPO_ROOT)
config = experiment.experiment()
strategy = make_strategy("default")
trainer = Trainer(config, strategy)
built = time.perf_counter()
iterator = trainer.train_iterator()
trainer.train(iterator, 1)
first = time.perf_counter()
print(json.dumps({"imports": imported - started, "data and model": built - imported,
                  "first step (trace)": first - built, "total": first - started}))
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, check=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    return json.loads(result.stdout.strip().splitlines()[-1])


def rss_growth(steps: int) -> dict:
    """Max RSS (MB) after 100 steps and after `steps` steps of the MLP at batch 64 (a flat line is the target)."""
    import resource

    case = Case("mlp", 64, 1)
    case.trainer.train(case.iterator, 100)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for _ in range(steps // 100):
        case.trainer.train(case.iterator, 100)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"steps": steps, "rss_mb_after_100": before, "rss_mb_after": after, "growth_mb": after - before}


def main() -> None:
    global STEPS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="cnn,mlp,cnn_wide,resnet20")
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--steps", type=int, default=STEPS, help="steps per timed block (a multiple of 100)")
    parser.add_argument("--rss_steps", type=int, default=10000, help="0 to skip")
    parser.add_argument("--xla_only", action="store_true",
                        help="only template SPL=100 and fixed batch, with and without XLA (experiment.jit_compile)")
    parser.add_argument("--output", default="runs/bench/throughput.json")
    args = parser.parse_args()
    if args.steps < 100 or args.steps % 100:
        parser.error(f"--steps={args.steps} must be a positive multiple of 100 (the largest STEPS_PER_LOOP).")
    STEPS = args.steps
    from common.tf_logging import quiet_tensorflow  # Before TensorFlow loads: its C++ start-up lines off.

    quiet_tensorflow()
    from tpu_utils.strategy import configure_virtual_cpus

    configure_virtual_cpus(max(args.replicas, 1))
    results = {"load_before": os.getloadavg(), "replicas": args.replicas, "date": time.strftime("%Y-%m-%d"),
               "steps_per_block": STEPS,
               "cases": {}}
    results["time_to_first_step"] = {} if args.xla_only else time_to_first_step()
    for model in args.models.split(","):
        for batch in (int(value) for value in args.batches.split(",")):
            results["cases"][f"{model} B={batch}"] = measure(Case(model, batch, args.replicas, xla_only=args.xla_only),
                                                             args.repetitions)
            print(f"measured {model} B={batch}", file=sys.stderr, flush=True)
    if args.rss_steps and not args.xla_only:
        results["rss"] = rss_growth(args.rss_steps)
    results["load_after"] = os.getloadavg()
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as handle:
        json.dump(results, handle, indent=2)
    print(table(results))


if __name__ == "__main__":
    main()
