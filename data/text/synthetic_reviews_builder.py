"""TFDS builder for `synthetic_reviews`: short product reviews generated from a template grammar, offline.

The worked example of the text classification task (tasks/text_classification.py). Each review is one or two
clauses about a product ("The battery is not very good, but the screen is great.") with optional neutral filler
("I bought it last week."), in mixed case with punctuation. Its label is the sentiment of the clause that decides:
the clause after "but" when there is one, else the only clause; an adjective's polarity flips under "not"/"never".
So the words alone do not tell the label (a bag of words sees "good" and "great" in a negative review): word order
and negation matter, which is what a sequence model is for. One label in twenty is flipped at random (annotation
noise, as in real data), so about 95% is the best test accuracy a model can reach.

5,000 reviews from NumPy seed 0; test = every fifth (index % 5 == 0, 1,000), train = the other 4,000; about half of
each class. Features: `text` (a string) and `label` (ClassLabel: negative, positive). At most 23 words per review.
"""

import numpy as np
import tensorflow_datasets as tfds

TEST_EVERY = 5  # Index % TEST_EVERY == 0 goes to the test split.
NUM_REVIEWS = 5000

NOUNS = ("battery", "screen", "camera", "keyboard", "speaker", "charger", "case", "price", "design", "sound",
         "display", "build quality", "software", "delivery", "packaging", "manual", "app", "fan", "lens", "strap")
POSITIVE = ("good", "great", "excellent", "fantastic", "solid", "reliable", "lovely", "superb", "decent", "perfect")
NEGATIVE = ("bad", "poor", "awful", "terrible", "flimsy", "useless", "disappointing", "cheap", "noisy", "broken")
INTENSIFIERS = ("", "", "very", "really", "quite", "truly", "rather", "so")
NEGATIONS = ("not", "never")
OPENERS = ("", "", "", "honestly,", "overall", "well,", "to be fair", "in short")
FILLERS = ("I bought it last week.", "It arrived on Tuesday.", "My brother uses one too.", "I use it every day.",
           "This is my second one.", "It came in a blue box.", "I got it as a gift.", "We ordered two of them.")
CLASS_NAMES = ("negative", "positive")
LABEL_NOISE = 0.05  # The chance that a review's label is flipped.


def _clause(rng: np.random.RandomState) -> tuple[str, int]:
    """'the <noun> is [not] [intensifier] <adjective>' and its polarity (1 positive, 0 negative)."""
    positive = rng.rand() < 0.5
    adjective = rng.choice(POSITIVE if positive else NEGATIVE)
    negated = rng.rand() < 0.35
    words = ["the", rng.choice(NOUNS), rng.choice(("is", "was", "seems", "feels"))]
    words += [rng.choice(NEGATIONS)] if negated else []
    words += [rng.choice(INTENSIFIERS), adjective]
    return " ".join(word for word in words if word), int(positive != negated)


def review(rng: np.random.RandomState) -> tuple[str, int]:
    """One generated review and its label (see the module docstring)."""
    text, label = _clause(rng)
    if rng.rand() < 0.4:  # A contrast: the clause after "but" decides.
        second, label = _clause(rng)
        text = f"{text}, but {second}"
    opener = rng.choice(OPENERS)
    sentence = f"{opener} {text}".strip()
    sentence = sentence[0].upper() + sentence[1:] + rng.choice((".", "!", "."))
    filler = rng.choice(FILLERS)
    placement = rng.randint(3)  # 0: none, 1: before, 2: after.
    if rng.rand() < LABEL_NOISE:
        label = 1 - label
    return {0: sentence, 1: f"{filler} {sentence}", 2: f"{sentence} {filler}"}[placement], label


class SyntheticReviews(tfds.core.GeneratorBasedBuilder):
    """Generated product reviews with a sentiment label (see the module docstring)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release: NumPy seed 0, 5,000 reviews, 5% label noise, test = index % 5 == 0."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Generated product reviews (negation, contrast with 'but'); label = sentiment.",
            features=tfds.features.FeaturesDict({
                "text": tfds.features.Text(),
                "label": tfds.features.ClassLabel(names=list(CLASS_NAMES)),
            }),
            supervised_keys=("text", "label"),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # Nothing to download: the reviews are generated.
        return {"train": self._generate_examples(is_test=False), "test": self._generate_examples(is_test=True)}

    def _generate_examples(self, is_test: bool):
        rng = np.random.RandomState(0)
        for index in range(NUM_REVIEWS):  # Every review is drawn, whichever split is built: the same corpus.
            text, label = review(rng)
            if (index % TEST_EVERY == 0) == is_test:
                yield index, {"text": text, "label": label}
