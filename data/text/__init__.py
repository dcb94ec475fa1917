"""A bundled offline text dataset: generated product reviews as a TFDS dataset ('synthetic_reviews')."""
