"""Datasets by name (`DATASET`): which TFDS dataset, which splits, and which task is learned from it.

To add a dataset: make (or pick, or stage with `python -m stage --from_...`) a TFDS dataset, then add a
`DatasetSpec` to `DATASETS` with the task that reads it (tasks/), or train it as `DATASET='tfds:NAME'` with a task
inferred from its metadata (data/staged_spec.py). The input pipelines and the serving signature both go through the
task, so training and serving see the same inputs.
"""

import dataclasses

from common.errors import ConfigError
from common.registry import lookup
from data import imagenet
from data.spec import DatasetSpec, check_task_features
from tasks.augmentation.flip_and_crop import flip_and_crop
from tasks.base import Task
from tasks.image_classification import ImageClassification
from tasks.tabular import TabularClassification, TabularRegression
from tasks.text_classification import TextClassification

# scikit-learn's names of the breast cancer columns (load_breast_cancer().feature_names): ten measures of the cell
# nuclei, as their mean, standard error and worst value.
_NUCLEUS_MEASURES = ("radius", "texture", "perimeter", "area", "smoothness", "compactness", "concavity",
                     "concave points", "symmetry", "fractal dimension")
BREAST_CANCER_FEATURES = (tuple(f"mean {measure}" for measure in _NUCLEUS_MEASURES)
                          + tuple(f"{measure} error" for measure in _NUCLEUS_MEASURES)
                          + tuple(f"worst {measure}" for measure in _NUCLEUS_MEASURES))


DATASETS: dict[str, DatasetSpec] = {
    # Bundled, offline: scikit-learn's 8x8 digits (data/digits). 1,437 train / 360 test images.
    "digits": DatasetSpec(tfds_name="sklearn_digits", train_split="train", eval_split="test",
                          module="data.digits.digits_dataset_builder",
                          task=ImageClassification(num_classes=10, image_shape=(8, 8, 1), max_pixel_value=16.0,
                                                   mean=(0.3,), std=(0.38,))),
    # Bundled, offline: the fine-tune example's halves of the same images (data/digits/digit_halves_builder.py):
    # digits 0-4 with every label (719 / 182), and 5-9 as classes 0-4 with 10 train labels per digit (50 / 178).
    **{name: DatasetSpec(tfds_name=f"sklearn_digit_halves/{name}", train_split="train", eval_split="test",
                         module="data.digits.digit_halves_builder",
                         task=ImageClassification(num_classes=5, image_shape=(8, 8, 1), max_pixel_value=16.0,
                                                  mean=(0.3,), std=(0.38,)))
       for name in ("digits_0_4", "digits_5_9_few")},
    # Downloaded by TFDS where internet exists (60,000 / 10,000 images).
    "mnist": DatasetSpec(tfds_name="mnist", train_split="train", eval_split="test",
                         task=ImageClassification(num_classes=10, image_shape=(28, 28, 1), mean=(0.1307,),
                                                  std=(0.3081,))),
    # Downloaded by TFDS where internet exists (50,000 / 10,000 images).
    "cifar10": DatasetSpec(tfds_name="cifar10", train_split="train", eval_split="test",
                           task=ImageClassification(num_classes=10, image_shape=(32, 32, 3),
                                                    mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
                                                    augment=flip_and_crop)),
    # ILSVRC 2012 (1,281,167 train / 50,000 validation images, 1,000 classes): no download exists; stage it from the
    # two tar files of image-net.org with `python -m stage --dataset=imagenet2012 --manual_dir=...`. Read by
    # shard file (~140 GB); JPEGs decoded to 224 x 224 crops (data/imagenet.py). Serving takes 224 x 224 images.
    "imagenet2012": DatasetSpec(tfds_name="imagenet2012", train_split="train", eval_split="validation",
                                read_by_shard=True,
                                task=ImageClassification(num_classes=1000,
                                                         image_shape=(imagenet.IMAGE_SIZE, imagenet.IMAGE_SIZE, 3),
                                                         mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                                                         train_decoder=imagenet.train_decoder,
                                                         eval_decoder=imagenet.eval_decoder)),
    # Bundled, offline: scikit-learn's breast cancer data (data/tabular). 30 float features, 2 classes;
    # 455 train / 114 test rows.
    "breast_cancer": DatasetSpec(tfds_name="sklearn_breast_cancer", train_split="train", eval_split="test",
                                 module="data.tabular.sklearn_tabular_builders",
                                 task=TabularClassification(num_features=30, num_classes=2,
                                                            feature_names=BREAST_CANCER_FEATURES)),
    # Bundled, offline: a generated regression set (data/tabular), 8 float features, one target; 4,000 / 1,000 rows.
    "synthetic_housing": DatasetSpec(tfds_name="synthetic_housing", train_split="train", eval_split="test",
                                     module="data.tabular.sklearn_tabular_builders",
                                     task=TabularRegression(num_features=8, label_key="target",
                                                            feature_names=tuple(f"x{index}" for index in range(8)))),
    # Bundled, offline: generated product reviews (data/text), a string and negative/positive; 4,000 / 1,000.
    # Tokenised in the graph to 32 ids with a vocabulary counted on the train split (tasks/text_classification.py).
    "synthetic_reviews": DatasetSpec(tfds_name="synthetic_reviews", train_split="train", eval_split="test",
                                     module="data.text.synthetic_reviews_builder",
                                     task=TextClassification(num_classes=2, sequence_length=32, max_tokens=1000)),
}


def get_dataset_spec(name: str, data_dir: str | None = None) -> DatasetSpec:
    """The registered DatasetSpec for `name`; for 'tfds:NAME' one read from that TFDS dataset's metadata in
    `data_dir` (data/staged_spec.py); a ConfigError that lists the known names otherwise."""
    if name.startswith("tfds:"):
        from data.staged_spec import spec_from_metadata

        return spec_from_metadata(name[len("tfds:"):], data_dir)
    spec = lookup(DATASETS, name, named=f"DATASET={name!r}", known="datasets", where="data/registry.py",
                  hint=", or use 'tfds:NAME' for a staged TFDS dataset")
    return dataclasses.replace(spec, name=name)


def bind_task(spec: DatasetSpec, builder, *, dataset: str) -> DatasetSpec:
    """`spec` with its task completed from the prepared dataset `builder` (class names, feature statistics, a
    vocabulary: Task.bind). A task that reads a feature the dataset lacks, or whose settings do not fit the data, is a
    ConfigError naming DATASET, the task and the fix, before anything is built."""
    features = builder.info.features
    check_task_features(spec, features, dataset=dataset)
    _check_stored_data(spec.task, features, dataset=dataset, tfds_name=spec.tfds_name)
    try:
        return dataclasses.replace(spec, task=spec.task.bind(builder))
    except ValueError as error:
        raise ConfigError(f"DATASET={dataset!r}: its task {type(spec.task).__name__} does not fit the data: "
                          f"{error} Fix the task's settings where the dataset is registered (data/registry.py).") \
            from error


def _check_stored_data(task: Task, features, *, dataset: str, tfds_name: str) -> None:
    """The task's settings against what the dataset's metadata says is stored: feature shapes, the number of classes
    and that a classification target holds class ids. Each mismatch would otherwise fail inside the training loop
    (an out-of-range label, an EnsureShape error), or on an accelerator not at all."""
    where = f"DATASET={dataset!r}: its task {type(task).__name__}"
    fix = ("Fix the task's settings where the dataset is registered (data/registry.py); a task that maps the stored "
           "labels to other classes sets targets_are_stored_labels = False (tasks/base.py).")
    for key, expected in task.stored_shapes().items():
        stored = tuple(features[key].shape)
        if None not in stored and stored != tuple(expected):
            raise ConfigError(f"{where} expects {key!r} of shape {tuple(expected)}, but {tfds_name!r} stores shape "
                              f"{stored}. {fix}")
    problem = task.stored_data_problem(features, tfds_name)
    if problem:
        raise ConfigError(f"{where} {problem}. {fix}")
