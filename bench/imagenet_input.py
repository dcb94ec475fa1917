"""Benchmark: images/s of the ImageNet training input pipeline on this host (by-shard order + 224 crops).

Builds a fake ImageNet with TFDS's real imagenet2012 builder (tests/fake_imagenet.py; random JPEGs at ImageNet's
typical size, default ~500 x 375) in a temporary folder, then times the train input pipeline of one host
(data/shard_stream.py + data/imagenet.py) for a number of global batches after a warm-up, and also the time a
resume takes to reach its first batch mid-block.

    .venv/bin/python bench/imagenet_input.py [--images 4000] [--shards 16] [--batch 256] [--batches 30]
                                             [--services 0,1,2] [--repetitions 1]

`--services`: also the same pipeline made by N tf.data services (DATA_SERVICE, data/service.py), each
`python -m data.service` in a process of its own on this host (N=0: the host's own tf.data). On one machine the
services share its cores with everything else: the figure shows the service's own cost, not the speed-up of
services on other machines (which add their cores). Repetitions run the cases interleaved; the median is printed.

The figure is what the host's CPUs can decode and crop: a TPU host must supply its chips' step rate times the global
batch. Random noise compresses worse than photos, so these JPEGs are larger (~2x) and slower to decode than
ImageNet's (~110 KB on average): a conservative figure.
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPOSITORY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4000, help="train images in the fake dataset")
    parser.add_argument("--shards", type=int, default=16, help="train shard files")
    parser.add_argument("--batch", type=int, default=256, help="global batch (one host)")
    parser.add_argument("--batches", type=int, default=30, help="timed batches after 5 warm-up batches")
    parser.add_argument("--height", type=int, default=375)
    parser.add_argument("--width", type=int, default=500)
    parser.add_argument("--services", default="0", help="comma-separated numbers of tf.data services, 0 = none")
    parser.add_argument("--repetitions", type=int, default=1)
    args = parser.parse_args()
    from common.tf_logging import quiet_tensorflow  # Before TensorFlow loads: its C++ start-up lines off.

    quiet_tensorflow()
    import tensorflow_datasets as tfds

    tfds.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="imagenet_bench_") as root:
        run(args, root)


def run(args: argparse.Namespace, root: str) -> None:
    import tensorflow as tf

    from data import pipeline
    from data.registry import get_dataset_spec
    from tests.fake_imagenet import prepare_fake_imagenet

    classes = 20
    started = time.perf_counter()
    builder = prepare_fake_imagenet(os.path.join(root, "tfds"), os.path.join(root, "manual"), num_shards=args.shards,
                                    classes=classes, per_class=args.images // classes, validation=args.shards,
                                    size=(args.height, args.width))
    split = builder.info.splits["train"]
    print(f"fake ImageNet: {split.num_examples} train images, {len(split.shard_lengths)} shards, "
          f"{split.num_bytes / split.num_examples / 1024:.0f} KB per image, built in "
          f"{time.perf_counter() - started:.0f} s", flush=True)

    spec = get_dataset_spec("imagenet2012")
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1)

    def time_batches(start_step: int, count: int, services=None) -> tuple[float, float]:
        """(seconds to the first batch, seconds for the next `count` batches)."""
        dataset = pipeline.make_train_input_fn(spec, builder, global_batch_size=args.batch, seed=0,
                                               start_step=start_step, services=services)(context)
        iterator = iter(dataset)
        begin = time.perf_counter()
        next(iterator)
        first = time.perf_counter() - begin
        for _ in range(4):
            next(iterator)
        begin = time.perf_counter()
        for _ in range(count):
            next(iterator)
        return first, time.perf_counter() - begin

    counts = [int(count) for count in args.services.split(",")]
    rates = {count: [] for count in counts}
    for _ in range(args.repetitions):
        for count in counts:
            with service_processes(count) as services:
                _, seconds = time_batches(0, args.batches, services)
            rates[count].append(args.batches * args.batch / seconds)
    cores = os.cpu_count() or 1
    for count in counts:
        rate = statistics.median(rates[count])
        where = "the host's own tf.data" if count == 0 else f"{count} tf.data service process(es) on this host"
        print(f"train input, {where}: {rate:,.0f} images/s on {cores} CPU cores ({rate / cores:,.0f} per core), "
              f"batch {args.batch} (runs: {', '.join(f'{value:,.0f}' for value in rates[count])})", flush=True)
    resume_step = split.num_examples // args.batch // 2 + 1  # Mid-epoch, inside a block.
    first, _ = time_batches(resume_step, 1)
    print(f"resume at step {resume_step}: first batch after {first:.2f} s", flush=True)


@contextlib.contextmanager
def service_processes(count: int):
    """InputServices over `count` `python -m data.service` processes on 127.0.0.1 (None for 0), stopped after."""
    if count == 0:
        yield None
        return
    from common.loopback import free_loopback_ports
    from data import service

    ports = free_loopback_ports(count)
    processes = [subprocess.Popen([sys.executable, "-m", "data.service", f"--port={port}", "--host=127.0.0.1"],
                                  cwd=REPOSITORY, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for port in ports]
    try:
        setting = service.parse(",".join(f"grpc://127.0.0.1:{port}" for port in ports))
        with service.started(setting, timeout_seconds=120) as services:
            yield services
    finally:
        for process in processes:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
