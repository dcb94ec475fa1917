"""A small Transformer encoder classifier for token sequences (the text example's model).

Token ids [batch, length] with 0 as padding -> token + position embeddings -> `num_blocks` pre-norm encoder blocks
(multi-head self-attention whose keys exclude padding, then a ReLU feed-forward, each added back to its input) ->
layer norm -> the mean over the non-padding positions -> Dense logits. No BatchNormalization; dropout is
`StatelessDropout` (keyed by example), so the model is replica-count invariant and exactly resumable.

An all-padding sequence (the eval pipeline pads the last batch with such examples) gives finite logits: the
attention's masked scores get a large negative number, not -inf, and the pooling divides by at least 1.
"""

import gin
import keras

from models.layers import StatelessDropout, logits_dtype


class PositionEmbedding(keras.layers.Layer):
    """Adds a learned vector per position to [batch, length, dim] inputs."""

    def build(self, input_shape):
        self.embeddings = self.add_weight(shape=(input_shape[1], input_shape[2]), initializer="uniform",
                                          name="embeddings")

    def call(self, x):
        return x + keras.ops.cast(self.embeddings, x.dtype)[None]


class EncoderBlock(keras.layers.Layer):
    """x + Dropout(Attention(LN(x))), then x + Dropout(FFN(LN(x))); `mask` [batch, length] marks real tokens."""

    def __init__(self, *, model_dim: int, num_heads: int, ffn_dim: int, dropout_rate: float, salt: int,
                 regularizer=None, **kwargs):
        super().__init__(**kwargs)
        if model_dim % num_heads:
            raise ValueError(f"transformer.model_dim={model_dim} must divide by transformer.num_heads={num_heads}.")
        self.attention_norm = keras.layers.LayerNormalization(epsilon=1e-6)
        self.attention = keras.layers.MultiHeadAttention(num_heads, model_dim // num_heads,
                                                         kernel_regularizer=regularizer)
        self.ffn_norm = keras.layers.LayerNormalization(epsilon=1e-6)
        self.ffn_in = keras.layers.Dense(ffn_dim, activation="relu", kernel_regularizer=regularizer)
        self.ffn_out = keras.layers.Dense(model_dim, kernel_regularizer=regularizer)
        # Keras' own attention dropout is left off: its masks would not be keyed by example.
        self.attention_dropout = StatelessDropout(dropout_rate, salt=salt)
        self.ffn_dropout = StatelessDropout(dropout_rate, salt=salt + 1)

    def call(self, x, mask, training=False):
        keys = keras.ops.cast(mask[:, None, :], "bool")  # [batch, 1, length]: every query sees the real keys.
        attention_mask = keras.ops.logical_and(keys, keras.ops.ones_like(mask, "bool")[:, :, None])
        normed = self.attention_norm(x)
        attended = self.attention(normed, normed, attention_mask=attention_mask, training=training)
        x = x + self.attention_dropout(attended, training=training)
        return x + self.ffn_dropout(self.ffn_out(self.ffn_in(self.ffn_norm(x))), training=training)


@gin.configurable
def transformer(input_shape, num_classes, *, vocab_size, model_dim=64, num_heads=4, ffn_dim=128, num_blocks=1,
                dropout_rate=0.0, synchronized_batch_norm=False, kernel_l2=0.0) -> keras.Model:
    """Token ids (int32, `input_shape` = (length,)) -> logits (float32, or float64 in float64).

    vocab_size: ids the embedding holds (padding 0, OOV 1, words); the text task supplies it (Task.model_options).
    synchronized_batch_norm is accepted for the builder interface; this model has no BatchNormalization.
    kernel_l2 regularises the Dense and attention kernels (not the embeddings).
    """
    del synchronized_batch_norm
    if len(input_shape) != 1:
        raise ValueError(f"transformer takes token ids of shape (length,); got input_shape={input_shape}. Use it "
                         "with a text task (tasks/text_classification.py).")
    for name, value in (("vocab_size", vocab_size), ("model_dim", model_dim), ("num_heads", num_heads),
                        ("ffn_dim", ffn_dim), ("num_blocks", num_blocks)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"transformer.{name}={value!r} must be an integer >= 1.")
    regularizer = keras.regularizers.L2(kernel_l2) if kernel_l2 else None
    tokens = keras.Input(shape=input_shape, dtype="int32", name="token_ids")
    mask = keras.ops.cast(keras.ops.not_equal(tokens, 0), keras.config.dtype_policy().compute_dtype)
    x = keras.layers.Embedding(vocab_size, model_dim, name="token_embedding")(tokens)
    x = PositionEmbedding(name="position_embedding")(x)
    x = StatelessDropout(dropout_rate, salt=0)(x)
    for index in range(num_blocks):
        x = EncoderBlock(model_dim=model_dim, num_heads=num_heads, ffn_dim=ffn_dim, dropout_rate=dropout_rate,
                         salt=1 + 2 * index, regularizer=regularizer, name=f"block_{index}")(x, mask)
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="final_norm")(x)
    # Mean over the real tokens; an all-padding sequence divides by 1, not 0.
    count = keras.ops.maximum(keras.ops.sum(mask, axis=1, keepdims=True), 1.0)
    pooled = keras.ops.sum(x * mask[:, :, None], axis=1) / count
    logits = keras.layers.Dense(num_classes, kernel_regularizer=regularizer, dtype=logits_dtype(),
                                name="logits")(pooled)
    return keras.Model(tokens, logits, name="transformer")
