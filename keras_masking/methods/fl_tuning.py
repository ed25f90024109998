"""FL-tuning's parameter count, and the deprecated function spellings of the
tuning methods (``fl_tune``, ``prefix_tune``, ``merge_fl``, ``unmerge_fl``).

The one way to turn a method on is a call on the model:
``backbone.enable_fl_tuning(units)`` / ``classifier.enable_fl_tuning(units)``,
``enable_prefix_tuning(length)``, and ``merge_fl()`` / ``unmerge_fl()``.
"""

import sys
import warnings

import keras
import keras_hub

from keras_masking.methods.parameter_report import parameter_report
from keras_masking.models.transformer_backbone import TransformerBackbone
from keras_masking.utils.arguments import check_bool
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


def _deprecated(old, new, stacklevel=3):
    warnings.warn(
        f"keras_masking.{old} is deprecated; call {new} instead.",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def _at_the_door(model):
    """A keras-hub BERT/RoBERTa backbone converted, anything else as it is."""
    if isinstance(model, (keras_hub.models.BertBackbone, keras_hub.models.RobertaBackbone)):
        return TransformerBackbone.from_keras_hub(model)
    return model


def _enable(model, verbose, old, method, **arguments):
    """The deprecated ``fl_tune`` / ``prefix_tune``: ``enable_<method>`` on the model's backbone."""
    _deprecated(old, f"model.enable_{method}(...)", stacklevel=4)  # the caller of fl_tune
    # Keras' verbose: True, False or the ints 0 / 1.
    if not (isinstance(verbose, int) and not isinstance(verbose, bool) and verbose in (0, 1)):
        verbose = check_bool("verbose", verbose)
    model = _at_the_door(model)
    getattr(model_backbone(model), f"enable_{method}")(**arguments)
    if verbose:
        name = {"fl_tuning": "FL-tuning", "prefix_tuning": "P-tuning v2"}[method]
        sys.stdout.write(f"{name}: {parameter_report(model)}\n")
    return model


def fl_tune(model, units=160, layers=None, attention_units=0, verbose=False):
    """Deprecated: ``model.enable_fl_tuning(units, layers, attention_units)``.

    Returns ``model`` tuned in place, or the converted backbone for a
    keras-hub backbone, as before.

    Example:
    ```python
    backbone.enable_fl_tuning(units=160)  # instead
    ```
    """
    arguments = dict(units=units, layers=layers, attention_units=attention_units)
    return _enable(model, verbose, "fl_tune", "fl_tuning", **arguments)


def prefix_tune(
    model, length=160, reparameterize=False, layers=None, dropout=0.1, hidden_units=512,
    verbose=False,
):  # fmt: skip
    """Deprecated: ``model.enable_prefix_tuning(length, ...)``.

    Example:
    ```python
    backbone.enable_prefix_tuning(length=160)  # instead
    ```
    """
    arguments = dict(length=length, layers=layers, dropout=dropout, hidden_units=hidden_units)
    return _enable(
        model, verbose, "prefix_tune", "prefix_tuning", reparameterize=reparameterize, **arguments
    )


def merge_fl(model, placement="suffix"):
    """Deprecated: ``model.merge_fl(placement)`` (a backbone or classifier).

    Returns a new model as before; on a functional model the layers outside
    the backbone are copies with the same weights.

    Example:
    ```python
    backbone.enable_fl_tuning(units=8)
    deployable = backbone.merge_fl()  # instead
    ```
    """
    _deprecated("merge_fl", "model.merge_fl()")
    return _replace_backbone(model, model_backbone(model).merge_fl(placement))


def unmerge_fl(model, units=None, placement=None, layers=None):
    """Deprecated: ``model.unmerge_fl(units, placement, layers)``.

    Example:
    ```python
    backbone.enable_fl_tuning(units=8)
    tuned_again = backbone.merge_fl().unmerge_fl()  # instead
    ```
    """
    _deprecated("unmerge_fl", "model.unmerge_fl()")
    return _replace_backbone(model, model_backbone(model).unmerge_fl(units, placement, layers))


def _replace_backbone(model, backbone):
    """``model`` rebuilt on ``backbone``, its other weights copied."""
    if isinstance(model, TransformerBackbone):
        return backbone
    if hasattr(model, "_with_backbone"):
        return model._with_backbone(backbone)
    old = model_backbone(model)
    if hasattr(model, "backbone"):  # another keras-hub task
        config = model.get_config()
        config.update(backbone=backbone, preprocessor=model.preprocessor)
        new_model = type(model).from_config(config)
    else:

        def clone(layer):
            if layer is old:
                return backbone
            return layer.__class__.from_config(layer.get_config())

        new_model = keras.models.clone_model(model, clone_function=clone)
    old_ids = {id(v) for v in old.weights}
    new_ids = {id(v) for v in backbone.weights}
    sources = [v for v in model.weights if id(v) not in old_ids]
    targets = [v for v in new_model.weights if id(v) not in new_ids]
    for source, target in zip(sources, targets, strict=True):
        # A copy: on JAX, assigning the variable would share its buffer.
        target.assign(keras.ops.convert_to_numpy(source).copy())
    return new_model
