"""The bundled offline dataset: scikit-learn's 8x8 handwritten digits as a TFDS dataset ('sklearn_digits')."""
