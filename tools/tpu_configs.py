"""Which shipped TPU config fits a TPU slice: chosen by the slice's replica count, the one thing a config fixes.

A config declares its replicas (`experiment.target_replicas`) and keeps the same global batch on every size, so a
v6e-8 runs the 8-replica config written for a v3-8, and a v5p-8 the 4-replica one written for a v4-8:

  replicas  configs (per model)   slices
  1         *_1_chip.gin          v5litepod-1, v6e-1 (Colab)
  4         *_v4_8.gin            v4-8, v5p-8, v5litepod-4, v6e-4
  8         *_v3_8.gin            v2-8, v3-8, v5litepod-8, v6e-8
  32        *_v3_32_pod.gin       v3-32 (and any other 32-replica slice)

  python -m tools.tpu_configs --accelerator_type=v6e-8 [--model=cifar10_resnet]
"""

import argparse
import os
import re
import sys

from tpu_utils.tpu.generations import parse_accelerator_type

CONFIG_DIR = "configs/tpu"
# Per model: {replicas: config file}. Keep in step with the files' `experiment.target_replicas` (a test checks).
CONFIGS = {
    "mnist_cnn": {1: "mnist_cnn_1_chip.gin", 4: "mnist_cnn_v4_8.gin", 8: "mnist_cnn_v3_8.gin"},
    "cifar10_resnet": {1: "cifar10_resnet_1_chip.gin", 4: "cifar10_resnet_v4_8.gin", 8: "cifar10_resnet_v3_8.gin",
                       32: "cifar10_resnet_v3_32_pod.gin"},
    "resnet50_imagenet": {4: "resnet50_imagenet_v4_8.gin", 8: "resnet50_imagenet_v3_8.gin",
                          32: "resnet50_imagenet_v3_32_pod.gin"},
    "resnet50_imagenet_lars": {32: "resnet50_imagenet_v3_32_pod_lars.gin"},  # LARS at batch 4096.
    "cifar10_mobilenet_v3_small": {1: "cifar10_mobilenet_v3_small_1_chip.gin"},  # keras.applications (Colab).
}
_TARGET_REPLICAS = re.compile(r"^experiment\.target_replicas\s*=\s*(\d+)", re.MULTILINE)


def config_for_replicas(model: str, replicas: int) -> str:
    """The config path (relative to the repository) for `model` on `replicas` TPU replicas; ValueError with the fix."""
    if model not in CONFIGS:
        raise ValueError(f"model {model!r}: TPU configs exist for {', '.join(CONFIGS)}.")
    if replicas not in CONFIGS[model]:
        sizes = ", ".join(str(count) for count in CONFIGS[model])
        raise ValueError(f"no {model} TPU config for {replicas} replica(s) (there are configs for {sizes}). Take the "
                         f"nearest one and add --gin_param=experiment.target_replicas={replicas} with a "
                         f"GLOBAL_BATCH_SIZE that divides by {replicas}.")
    return f"{CONFIG_DIR}/{CONFIGS[model][replicas]}"


def config_for_accelerator_type(model: str, accelerator_type: str) -> str:
    """The config for an accelerator type such as v6e-8 (its replica count: see generations.py)."""
    replicas = parse_accelerator_type(accelerator_type).replicas
    if replicas is None:
        raise ValueError(f"accelerator type {accelerator_type!r}: a generation this template does not know, so its "
                         "replica count is unknown; pick a config by hand from configs/tpu/.")
    return config_for_replicas(model, replicas)


def declared_replicas(path: str, repo_root: str = ".") -> int:
    """The `experiment.target_replicas` a config file declares (0 if none)."""
    with open(os.path.join(repo_root, path)) as handle:
        match = _TARGET_REPLICAS.search(handle.read())
    return int(match.group(1)) if match else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.tpu_configs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accelerator_type", required=True, help="e.g. v5litepod-1, v6e-8, v5p-8")
    parser.add_argument("--model", default="cifar10_resnet", choices=sorted(CONFIGS))
    args = parser.parse_args(argv)
    try:
        print(config_for_accelerator_type(args.model, args.accelerator_type))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
