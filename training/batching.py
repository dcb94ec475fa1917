"""How a step's examples split over replicas and micro-batches: one Batching per run, computed once from the
settings and the replica count, and passed down (the Trainer, its augmentation and eval input, the preflight, XLA's
'auto'). The input pipelines get each host's share from TensorFlow's InputContext, which splits the same way."""

import dataclasses

from common.errors import ConfigError
from common.settings import how_to_set, nearest_multiple, require_int


@dataclasses.dataclass(frozen=True)
class Batching:
    global_batch: int  # GLOBAL_BATCH_SIZE: the examples of one optimizer step, over every replica.
    replicas: int
    accumulate_steps: int  # ACCUMULATE_STEPS: micro-batches per step.
    eval_global_batch: int  # experiment.eval_batch_size, else GLOBAL_BATCH_SIZE rounded down to the replicas.

    @property
    def per_replica(self) -> int:
        return self.global_batch // self.replicas

    @property
    def micro_batch(self) -> int:
        """The rows one replica's step sees at once: its share of one micro-batch."""
        return self.per_replica // self.accumulate_steps

    @property
    def eval_per_replica(self) -> int:
        return self.eval_global_batch // self.replicas


def batching_for(config, replicas: int, *, training: bool = True) -> Batching:
    """The Batching of `config` on `replicas` replicas; a ConfigError when a batch does not split evenly (every
    replica runs the same static shape). Evaluating alone (`training=False`) needs only the eval batch to split."""
    eval_global = config.eval_batch_size or max(replicas, config.global_batch_size // replicas * replicas)
    batches = [("experiment.eval_batch_size", eval_global)]
    if training:
        batches.insert(0, ("GLOBAL_BATCH_SIZE", config.global_batch_size))
    batch, steps = config.global_batch_size, config.accumulate_steps
    if training and steps > 1 and batch % (steps * replicas):
        multiple = steps * replicas
        raise ConfigError(f"GLOBAL_BATCH_SIZE={batch} does not divide by ACCUMULATE_STEPS={steps} x the {replicas} "
                          f"replicas of this strategy ({multiple}): each replica's micro-batch must be whole. Use a "
                          f"multiple of {multiple}, e.g. "
                          f"{how_to_set('global_batch_size', nearest_multiple(batch, multiple))}, or a smaller "
                          "ACCUMULATE_STEPS.")
    for name, value in batches:
        if value % replicas:
            lower = value // replicas * replicas
            raise ConfigError(f"{name}={value} does not divide by the {replicas} replicas of this strategy. Use a "
                              f"multiple of {replicas}, e.g. {lower or replicas} or {lower + replicas}.")
    return Batching(global_batch=batch, replicas=replicas, accumulate_steps=steps, eval_global_batch=eval_global)


def check_settings(config) -> None:
    """experiment.eval_batch_size: None (GLOBAL_BATCH_SIZE's) or an integer >= 1."""
    if config.eval_batch_size is not None:
        require_int("eval_batch_size", config.eval_batch_size, minimum=1, example=128)
