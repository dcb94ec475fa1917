"""Training augmentation, in one home: what `experiment.augmentation` names (by_name.py: checked against the
task's kind, Task.augmentations, and resolved into the task's per-example augmentation and the step's batch
mixing), the per-example augmentations (flip_and_crop.py, randaugment.py: in the input pipeline, or on the device
where the split is kept there) and the per-batch mixings (mixing.py: mixup, CutMix, in the training step). Every
random draw is keyed by (SEED, example position) (common/keyed_random.py), so augmented batches are the same at any
replica count and after a resume."""
