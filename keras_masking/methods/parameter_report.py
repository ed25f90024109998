"""What is trainable in a model, counted."""

import dataclasses
import math

import keras

from keras_masking.utils.arguments import check_int


@dataclasses.dataclass(frozen=True)
class ParameterReport:
    """Trainable and total parameter counts of a model.

    Attributes:
        trainable: int, parameters in trainable variables.
        total: int, parameters in all variables (each shared variable once).

    Example:
    >>> report = ParameterReport(trainable=30, total=120)
    >>> report.ratio
    0.25
    >>> print(report)
    trainable parameters: 30 of 120 (25.00%)
    """

    trainable: int
    total: int

    def __post_init__(self):
        for name in ("trainable", "total"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum=0))
        if self.trainable > self.total:
            raise ValueError(
                "Expected trainable <= total. "
                f"Received: trainable={self.trainable}, total={self.total}."
            )

    @property
    def ratio(self):
        """``trainable / total``."""
        return self.trainable / self.total if self.total else 0.0

    def __str__(self):
        return f"trainable parameters: {self.trainable:,} of {self.total:,} ({self.ratio:.2%})"


def parameter_report(model):
    """Counts ``model``'s trainable and total parameters.

    Each variable counts once, however many layers share it.

    Args:
        model: a Keras model or layer.

    Returns:
        A `ParameterReport`.

    Example:
    ```python
    print(keras_masking.methods.parameter_report(model))
    # trainable parameters: 2,960,256 of 105,... (2.8%)
    ```
    """
    if not isinstance(model, keras.layers.Layer):
        raise TypeError(
            f"Expected a Keras model or layer for model. Received: model of type "
            f"{type(model).__name__}."
        )

    def count(variables):
        unique = {id(v): v for v in variables}
        return sum(math.prod(v.shape) for v in unique.values())

    return ParameterReport(count(model.trainable_weights), count(model.weights))
