"""Initializer helpers shared by the layers."""

import keras


def clone_initializer(initializer):
    """Returns a fresh copy of ``initializer`` so layers do not share one.

    Args:
        initializer: anything `keras.initializers.get` accepts.

    Returns:
        A new `keras.initializers.Initializer` with the same config.
    """
    initializer = keras.initializers.get(initializer)
    return initializer.__class__.from_config(initializer.get_config())


def bert_initializer(stddev=0.02):
    """BERT's ``TruncatedNormal(stddev)`` kernel initializer."""
    return keras.initializers.TruncatedNormal(stddev=stddev)
