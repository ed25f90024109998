"""What is trainable in a model, counted."""

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class ParameterReport:
    """Trainable and total parameter counts of a model.

    Attributes:
        trainable: int, parameters in trainable variables.
        total: int, parameters in all variables (each shared variable once).
    """

    trainable: int
    total: int

    @property
    def ratio(self):
        """``trainable / total``."""
        return self.trainable / self.total if self.total else 0.0

    def __str__(self):
        return f"trainable parameters: {self.trainable:,} of {self.total:,} ({self.ratio:.2%})"


def parameter_report(model):
    """Counts ``model``'s trainable and total parameters.

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

    def count(variables):
        unique = {id(v): v for v in variables}
        return sum(math.prod(v.shape) for v in unique.values())

    return ParameterReport(count(model.trainable_weights), count(model.weights))
