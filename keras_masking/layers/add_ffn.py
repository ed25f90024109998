"""FL-tuning's addFFN: a small trainable FFN in parallel with a frozen one."""

import keras
import numpy as np

from keras_masking.layers.activations import activation_name
from keras_masking.layers.feed_forward import FeedForward
from keras_masking.layers.initializers import bert_initializer
from keras_masking.utils.arguments import check_int


@keras.saving.register_keras_serializable(package="keras_masking")
class AddFFN(FeedForward):
    """``f(x W1' + b1') W2' + b2'``: k extra hidden units for one FFN.

    A `FeedForward` with ``units`` hidden units whose output is added to the
    frozen FFN's output (`TransformerBlock.attach_feed_forward_branch`); with
    the base FFN's activation the sum is exactly a plain FFN with ``m + k``
    hidden units (`TransformerBackbone.merge_fl`). Kernels start from
    ``TruncatedNormal(0.02)``, biases from zeros, as in the FL-tuning paper.

    Args:
        units: int >= 1, the number of added hidden units ``k`` (160 in the
            paper).
        activation: the base FFN's activation (name or callable).
        kernel_initializer: initializer of both kernels.
        **kwargs: base `keras.layers.Layer` arguments.

    Example:
    >>> branch = AddFFN(units=8, activation="gelu")
    >>> tuple(branch(keras.ops.ones((2, 5, 32))).shape)
    (2, 5, 32)
    """

    def __init__(self, units, activation="gelu", kernel_initializer=None, **kwargs):
        units = check_int("units", units, minimum=1)
        super().__init__(
            intermediate_dim=units,
            activation=activation_name(activation),
            kernel_initializer=kernel_initializer or bert_initializer(),
            **kwargs,
        )

    @property
    def units(self):
        """The number of added hidden units."""
        return self.intermediate_dim

    def get_config(self):
        config = super().get_config()
        config["units"] = config.pop("intermediate_dim")
        return config


def merge_feed_forward_weights(base, branch, at):
    """One FFN's weights with an addFFN's units inserted: the exact sum.

    Hidden units are exchangeable, so ``FFN(x) + AddFFN(x)`` is one FFN with
    ``m + k`` units: ``W1 <- [W1 W1']``, ``b1 <- [b1 b1']``, ``W2 <- [W2;
    W2']``, ``b2 <- b2 + b2'``, the new units placed from index ``at``.

    Args:
        base: the FFN's ``[W1, b1, W2, b2]`` (numpy arrays).
        branch: the `AddFFN`'s ``[W1', b1', W2', b2']``.
        at: int in ``[0, m]``, where the new units go.

    Returns:
        The merged FFN's ``[W1, b1, W2, b2]``.

    Example:
    >>> import numpy as np
    >>> base = [np.ones((4, 3)), np.zeros(3), np.ones((3, 4)), np.zeros(4)]
    >>> branch = [np.ones((4, 2)), np.zeros(2), np.ones((2, 4)), np.ones(4)]
    >>> [w.shape for w in merge_feed_forward_weights(base, branch, at=3)]
    [(4, 5), (5,), (5, 4), (4,)]
    """
    (w1, b1, w2, b2), (a1, c1, a2, c2) = base, branch
    return [
        np.concatenate([w1[:, :at], a1, w1[:, at:]], axis=1),
        np.concatenate([b1[:at], c1, b1[at:]]),
        np.concatenate([w2[:at], a2, w2[at:]], axis=0),
        b2 + c2,
    ]


def split_feed_forward_weights(weights, units, at):
    """The converse of `merge_feed_forward_weights`: ``(base, branch)``.

    The branch's output bias is not recoverable from ``b2 + b2'``: it starts
    at zero and the base keeps the sum.

    Args:
        weights: the merged FFN's ``[W1, b1, W2, b2]``.
        units: int, the branch's hidden units ``k``.
        at: int, where they sit.

    Returns:
        ``(base, branch)``, two ``[W1, b1, W2, b2]`` lists.

    Example:
    >>> import numpy as np
    >>> merged = [np.ones((4, 5)), np.zeros(5), np.ones((5, 4)), np.ones(4)]
    >>> base, branch = split_feed_forward_weights(merged, units=2, at=3)
    >>> base[0].shape, branch[0].shape
    ((4, 3), (4, 2))
    """
    w1, b1, w2, b2 = weights
    added = slice(at, at + units)
    keep = np.r_[0:at, at + units : w1.shape[1]]
    return [w1[:, keep], b1[keep], w2[keep], b2], [w1[:, added], b1[added], w2[added], 0 * b2]


def insert_index(placement, base_units):
    """Where ``placement`` (``"suffix"``, ``"prefix"`` or an int) puts new units.

    Example:
    >>> insert_index("suffix", 8), insert_index("prefix", 8), insert_index(3, 8)
    (8, 0, 3)
    """
    if isinstance(placement, str) and placement in ("suffix", "prefix"):
        return base_units if placement == "suffix" else 0
    if (
        isinstance(placement, (int, np.integer))
        and not isinstance(placement, (bool, np.bool_))
        and 0 <= placement <= base_units
    ):
        return int(placement)
    raise ValueError(
        f"Expected 'prefix', 'suffix' or an integer in [0, {base_units}] for placement. "
        f"Received: placement={placement!r}."
    )
