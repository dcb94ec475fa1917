"""Benchmark: gradient clipping after the cross-replica sum, with one all-reduce (the template) or two.

Both variants give the same weights (clip the summed gradients by global norm). The template sums once in the step
and switches off Keras' implicit all-reduce; the textbook alternative (all-reduce, clip, divide by R, then let
`apply_gradients` all-reduce again) sends every gradient over the wire twice.

    .venv/bin/python bench/clip_allreduce.py [--replicas 4] [--hidden 1024] [--steps 200]

Prints examples/s for each variant on MirroredStrategy over virtual CPU devices. On CPUs the "wire" is memory
copies, so this shows the extra work, not what NVLink or a TPU interconnect would cost.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_variant(double_all_reduce: bool, replicas: int, hidden: int, steps: int, batch: int,
                warmup: int = 10) -> tuple[float, list]:
    import keras
    import numpy as np
    import tensorflow as tf

    from tpu_utils.loop import make_train_loop
    from tpu_utils.strategy import make_strategy
    from training.learning import step

    strategy = make_strategy("mirrored", virtual_devices=replicas)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(hidden, activation="relu"),
                                  keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(10)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
        global_step = tf.Variable(0, dtype=tf.int64, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    def loss_fn(labels, logits):
        return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)

    if double_all_reduce:
        def replica_step(batch_data):
            images, labels, _ = batch_data
            with tf.GradientTape() as tape:
                loss = step.average_over_global_batch(loss_fn(labels, model(images)), batch)
            gradients = step.sum_across_replicas(tape.gradient(loss, model.trainable_variables))
            gradients, _ = tf.clip_by_global_norm(gradients, 1.0)
            gradients = [gradient / replicas for gradient in gradients]  # apply_gradients sums them again.
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return {"loss": loss}
    else:
        replica_step = step.make_train_step(model, optimizer, loss_fn, global_batch_size=batch, clip_global_norm=1.0,
                                            metrics=[], seed=0)

    rng = np.random.RandomState(0)
    examples = (rng.rand(batch * 8, 784).astype("float32"), rng.randint(0, 10, batch * 8), np.arange(batch * 8))
    data = tf.data.Dataset.from_tensor_slices(examples).repeat().batch(batch)  # (features, label, position)
    iterator = iter(strategy.experimental_distribute_dataset(data))
    train_loop = make_train_loop(strategy, replica_step, global_step)
    train_loop(iterator, tf.constant(warmup))  # Trace and warm up.
    started = time.perf_counter()
    train_loop(iterator, tf.constant(steps))
    seconds = time.perf_counter() - started
    return steps * batch / seconds, [weight.numpy() for weight in model.weights]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    from common.tf_logging import quiet_tensorflow  # Before TensorFlow loads: its C++ start-up lines off.

    quiet_tensorflow()
    from tpu_utils.strategy import configure_virtual_cpus

    configure_virtual_cpus(args.replicas)
    import numpy as np

    # Same math: compare after 1 + 5 steps (over hundreds of steps with a binding clip, float32 rounding differences
    # grow chaotically, measured 1e-7 -> 5e-3 -> 5e-2 after 5, 50, 200 steps, in either variant alone as well).
    _, single_weights = run_variant(False, args.replicas, args.hidden, 5, args.batch, warmup=1)
    _, double_weights = run_variant(True, args.replicas, args.hidden, 5, args.batch, warmup=1)
    worst = max(float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
                for a, b in zip(single_weights, double_weights, strict=True))
    single, _ = run_variant(False, args.replicas, args.hidden, args.steps, args.batch)
    double, _ = run_variant(True, args.replicas, args.hidden, args.steps, args.batch)
    print(f"replicas {args.replicas}, MLP 784-{args.hidden}-{args.hidden}-10, global batch {args.batch}, "
          f"{args.steps} steps")
    print(f"  one all-reduce (template): {single:10,.0f} examples/s")
    print(f"  two all-reduces          : {double:10,.0f} examples/s   (time ratio two/one: {single / double:.2f})")
    print(f"  same math: worst relative weight difference after 6 steps {worst:.1e}")


if __name__ == "__main__":
    main()
