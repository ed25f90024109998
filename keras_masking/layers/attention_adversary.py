"""AttentionAdversary: ASA's per-layer learned attention mask."""

import hashlib
import math

import keras
from keras import ops

from keras_masking.distribution.random import batch_uniform
from keras_masking.ops.gradient_reversal import reverse_gradient
from keras_masking.ops.gradient_reversal import straight_through_step
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_seed

#: The official code's mask value: masked logits become exactly this.
MASK_VALUE = -10000.0


@keras.saving.register_keras_serializable(package="keras_masking")
class AttentionAdversary(keras.layers.Layer):
    """The adversary of one layer in ASA (adversarial self-attention).

    Wu et al. (2023), "Adversarial Self-Attention for Language
    Understanding", as the official code computes it (``AsaBert.Adversary``):

    1. ``H = stop_gradient(hidden)``, the hidden states entering the layer.
    2. One head of full width ``d``: ``S = (H W_q + b_q)(H W_k + b_k)^T /
       sqrt(d) + P``, ``P`` the padding bias over keys (0 / -10000).
    3. ``M = 1[S > 0]`` forward, ``sigmoid(S)``'s gradient backward
       (`keras_masking.ops.straight_through_step`); 1 keeps a pair.
    4. A gradient reversal of strength ``alpha`` on ``M``.

    The layer returns ``M``, ``(batch, query, key)`` float32 (whatever the
    dtype policy); `mask_bias` turns it into the mask ``(1 - M) * -10000``
    that replaces that layer's padding mask.

    Args:
        alpha: float >= 0, strength of the gradient reversal (1 officially).
        noise: bool. False (official): the code's Gumbel noise is added and
            subtracted, so the mask is deterministic. True (a deviation):
            logistic noise (the difference of two Gumbel samples) is added to
            the scores before the step in training.
        initializer_range: float, the std of the kernels' normal init.
        seed: int or None, for ``noise``.
        **kwargs: base `keras.layers.Layer` arguments (the dtype is always
            float32).

    Call arguments:
        hidden: float tensor ``(batch, sequence, hidden)``.
        padding_mask: optional 0/1 tensor ``(batch, sequence)``.
        training: bool; noise (if any) is drawn only in training.

    Example:
    >>> adversary = AttentionAdversary()
    >>> mask = adversary(keras.ops.ones((2, 5, 32)), np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]))
    >>> tuple(mask.shape)
    (2, 5, 5)
    >>> float(keras.ops.max(mask[1, :, 3:]))  # padded keys are always masked
    0.0
    """

    def __init__(self, alpha=1.0, noise=False, initializer_range=0.02, seed=None, **kwargs):
        kwargs.pop("dtype", None)
        super().__init__(dtype="float32", **kwargs)
        self.alpha = check_float("alpha", alpha, minimum=0.0)
        self.noise = check_bool("noise", noise)
        self.initializer_range = check_float(
            "initializer_range", initializer_range, minimum=0.0, open_minimum=True
        )
        self.seed = check_seed("seed", seed)
        self.seed_generator = keras.random.SeedGenerator(seed) if noise else None
        self.query = None
        self.key = None

    def build(self, input_shape):
        width = input_shape[-1]
        if width is None:
            raise ValueError("AttentionAdversary needs a known hidden size (last axis).")
        for name in ("query", "key"):
            projection = keras.layers.Dense(
                width,
                kernel_initializer=keras.initializers.RandomNormal(stddev=self.initializer_range),
                bias_initializer="zeros",
                dtype="float32",
                name=name,
            )
            projection.build(tuple(input_shape))
            setattr(self, name, projection)
        self.built = True

    def scores(self, hidden, padding_mask=None):
        """``S = Q K^T / sqrt(d) + P``, float32 ``(batch, query, key)``.

        The input's gradient is stopped here.
        """
        hidden = ops.cast(ops.stop_gradient(hidden), "float32")
        query = self.query(hidden)
        key = self.key(hidden)
        width = ops.shape(query)[-1]
        scores = ops.einsum("bqd,bkd->bqk", query, key) / math.sqrt(width)
        if padding_mask is not None:
            keep = ops.cast(ops.cast(padding_mask, "bool"), "float32")
            scores = scores + ((1.0 - keep) * MASK_VALUE)[:, None, :]
        return scores

    def call(self, hidden, padding_mask=None, training=None):
        scores = self.scores(hidden, padding_mask)
        noise = None
        if self.noise and training:
            uniform = batch_uniform(
                ops.shape(scores), self.seed_generator, minval=1e-7, maxval=1.0 - 1e-7
            )
            noise = ops.log(uniform) - ops.log(1.0 - uniform)
        mask = straight_through_step(scores, threshold_noise=noise)
        return reverse_gradient(mask, self.alpha)

    @staticmethod
    def mask_bias(mask):
        """``(1 - M) * -10000`` as ``(batch, 1, query, key)``, shared by all heads."""
        return ((1.0 - ops.cast(mask, "float32")) * MASK_VALUE)[:, None, :, :]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[1], input_shape[1])

    def get_config(self):
        names = ("alpha", "noise", "initializer_range", "seed")
        return {**super().get_config(), **{name: getattr(self, name) for name in names}}


def attention_adversaries(layers, hidden_dim, alpha=1.0, noise=False, seed=None):
    """One built `AttentionAdversary` per attacked layer, ``{index: adversary}``.

    Args:
        layers: the attacked layer indices.
        hidden_dim: int, the encoder's hidden size.
        alpha, noise: see `AttentionAdversary`.
        seed: int or None; layer ``i``'s adversary gets a seed of its own
            derived from ``(seed, i)`` (`adversary_seed`).

    Example:
    >>> sorted(attention_adversaries([0, 2], hidden_dim=8))
    [0, 2]
    """
    adversaries = {}
    for index in layers:
        adversary = AttentionAdversary(
            alpha=alpha,
            noise=noise,
            seed=None if seed is None else adversary_seed(seed, index),
            name=f"adversary_{index}",
        )
        adversary.build((None, None, hidden_dim))
        adversaries[index] = adversary
    return adversaries


def adversary_seed(seed, index):
    """The seed of layer ``index``'s adversary in a run seeded ``seed``.

    Derived, not ``seed + index``: a `keras.random.SeedGenerator` of seed
    ``s`` draws the same numbers as any other of seed ``s``, so seed 0's
    second adversary drew seed 1's first one's noise, and DropToken given the
    run's seed drew the first adversary's (its drops and the adversary's
    threshold noise moved together).

    Args:
        seed: int, the seed given to `enable_asa` / `ASATrainer`.
        index: int, the attacked layer.

    Example:
    >>> adversary_seed(0, 1) != adversary_seed(1, 0)
    True
    """
    digest = hashlib.sha256(f"keras_masking.attention_adversary/{seed}/{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
