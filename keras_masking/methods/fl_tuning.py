"""FL-tuning's parameter count, and the backbone a model is built on.

FL-tuning itself is a call on the model: ``backbone.enable_fl_tuning(units)``
/ ``classifier.enable_fl_tuning(units)``, then ``merge_fl()`` /
``unmerge_fl()``.
"""

from keras_masking.models.transformer_backbone import TransformerBackbone
from keras_masking.utils.arguments import check_int


def add_ffn_parameter_count(hidden_dim, units, num_layers):
    """Parameters FL-tuning adds: ``layers * (2 d k + k + d)``.

    Args:
        hidden_dim: int >= 1, the hidden size ``d``.
        units: int >= 0, added units per FFN ``k``.
        num_layers: int >= 0, tuned layers.

    Returns:
        The parameter count, an int.

    Example:
    >>> add_ffn_parameter_count(768, 160, 12)
    2960256
    """
    hidden_dim = check_int("hidden_dim", hidden_dim, minimum=1)
    units = check_int("units", units, minimum=0)
    num_layers = check_int("num_layers", num_layers, minimum=0)
    if not units:
        return 0
    return num_layers * (2 * hidden_dim * units + units + hidden_dim)


def model_backbone(model):
    """The `TransformerBackbone` a model is built on: the model itself, its
    ``backbone`` attribute (a keras-hub task), or the one layer of a
    functional model that is one.

    Raises:
        TypeError: when there is none; ValueError: when there are several.

    Example:
    ```python
    assert model_backbone(backbone) is backbone
    ```
    """
    candidates = [model, getattr(model, "backbone", None), *getattr(model, "layers", [])]
    found = {id(c): c for c in candidates if isinstance(c, TransformerBackbone)}
    if len(found) > 1:
        raise ValueError(
            f"Expected exactly one backbone in the model. Received: {len(found)}; call the "
            "method on each backbone (backbone.enable_...)."
        )
    if not found:
        raise TypeError(
            "Expected a keras_masking TransformerBackbone or a model built on one (a keras-hub "
            "backbone converts with TransformerBackbone.from_keras_hub(backbone)). Received: "
            f"{type(model).__name__}."
        )
    return next(iter(found.values()))
