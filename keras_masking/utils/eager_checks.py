"""Value checks that run when inputs are concrete (eager calls).

Inside a compiled step (``tf.function``, ``jax.jit``) values are symbolic and
cannot be inspected without a data-dependent branch, so these checks are
skipped there; eager calls (``model(inputs)``) get a clear error instead of
TensorFlow's gather error or JAX's silent clamping.
"""

import sys
from collections.abc import Mapping

import numpy as np
from keras import backend
from keras import ops as keras_ops

from keras_masking.utils.training_state import build_optimizer
from keras_masking.utils.training_state import weights_kept_on_error


def concrete_value(x):
    """``x`` as a numpy array if it is concrete, else None.

    Args:
        x: a numpy array, an eager tensor of the active backend, or a
            symbolic/traced tensor.

    Returns:
        A numpy array, or None for symbolic and traced values.
    """
    if x is None:
        return None
    if isinstance(x, (np.ndarray, list, tuple, int)):
        return np.asarray(x)
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(x, tf.Tensor):  # on any backend (a JAX model's data)
        eager = tf.executing_eagerly() and hasattr(x, "numpy")
        return x.numpy() if eager else None
    name = backend.backend()
    if name == "jax":
        import jax

        eager = isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
        return np.asarray(x) if eager else None
    return np.asarray(x) if name == "numpy" else None


def check_ids_in_range(ids, upper, what, limit_name):
    """Raises ValueError if concrete ``ids`` fall outside ``[0, upper)``.

    Args:
        ids: integer tensor.
        upper: exclusive upper bound.
        what: name of the ids in the message (``"token_ids"``).
        limit_name: name of the bound in the message.
    """
    values = concrete_value(ids)
    if values is None or values.size == 0:
        return
    bad = values[(values < 0) | (values >= upper)]
    if bad.size:
        raise ValueError(
            f"Expected {what} in [0, {upper}) ({limit_name}={upper}). "
            f"Received: {what} with the values {sorted(set(bad.tolist()))[:10]}."
        )


def non_finite_variables(variables):
    """The float variables holding NaN or infinite values.

    Args:
        variables: an iterable of Keras variables (``model.weights``).

    Returns:
        A list of ``(variable.path, count of non-finite values)``, in order.

    Example:

    >>> import keras
    >>> non_finite_variables([keras.Variable([1.0, float("nan")], name="w")])
    [('w', 1)]
    """
    found = []
    for variable in variables:
        if not backend.is_float_dtype(variable.dtype):
            continue
        values = np.asarray(keras_ops.convert_to_numpy(variable))
        count = int(values.size - np.count_nonzero(np.isfinite(values)))
        if count:
            found.append((variable.path, count))
    return found


def static_shape(x):
    """The static shape of a tensor, array or nested list as a tuple.

    Unknown dimensions (symbolic tensors, and JAX's shape-polymorphic
    dimensions when a model is exported) are None.
    """
    shape = getattr(x, "shape", None)
    if shape is None:
        shape = np.shape(x)
    return tuple(int(d) if isinstance(d, (int, np.integer)) else None for d in shape)


def dims_match(shape, reference, broadcast_batch=False):
    """Whether the known sizes of ``shape`` agree with ``reference``'s, axis by axis.

    Only the axes both have are compared; None matches any size, and so does
    a batch (axis 0) of 1 with ``broadcast_batch``.

    Example:

    >>> dims_match((1, None), (4, 7), broadcast_batch=True), dims_match((4, 6), (4, 7))
    (True, False)
    """
    return all(
        a is None or b is None or a == b or (axis == 0 and broadcast_batch and a == 1)
        for axis, (a, b) in enumerate(zip(shape, reference))
    )


def dtype_name(x):
    """The standardized dtype name of a tensor, array or nested list."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = np.asarray(x).dtype
    return backend.standardize_dtype(dtype)


def check_integer_ids(name, ids):
    """Raises ValueError unless ``ids`` has an integer dtype (not bool, not float).

    A float id such as 5.7 has no row: it would be truncated silently by the
    cast to int32 that functional models apply. Concrete ids (numpy arrays,
    lists, eager tensors: what ``fit``, ``predict`` and an eager call see
    first) are refused by their dtype. Symbolic float ids inside a traced
    function pass: their values cannot be seen there, and Keras itself
    traces a model with float ids when it builds it under `tf.distribute`
    (it averages the replicas' first batches).

    Args:
        name: the ids' name in the message.
        ids: a tensor, numpy array or nested list.
    """
    dtype = dtype_name(ids)
    if "int" not in dtype:
        found = ""
        values = concrete_value(ids) if dtype != "string" else None
        if values is None and "float" in dtype:
            return  # symbolic: see above
        if values is not None and values.size:
            whole = np.asarray(values, "float64")
            odd = values[np.mod(whole, 1) != 0] if "float" in dtype else values
            odd = sorted(set(np.asarray(odd).ravel().tolist()))[:5]
            if odd:
                found = f" with the values {[float(f'{value:.6g}') for value in odd]}"
        raise ValueError(f"Expected integer {name}. Received: {name} of dtype {dtype}{found}.")


def check_zero_one(name, mask):
    """Raises ValueError if the concrete values of ``mask`` are not all 0 or 1."""
    if dtype_name(mask) in ("string",):
        raise ValueError(f"Expected {name} of 0s and 1s. Received: {name} of dtype string.")
    values = concrete_value(mask)
    if values is None or not values.size or values.dtype == bool:
        return
    bad = ~np.isin(np.asarray(values, "float64"), (0.0, 1.0))
    if bad.any():
        found = sorted(set(np.asarray(values)[bad].tolist()))[:10]
        raise ValueError(f"Expected {name} of 0s and 1s. Received: {name} with the values {found}.")


def check_encoder_inputs(
    inputs,
    vocabulary_size,
    num_segments=0,
    required=("token_ids", "padding_mask"),
    position_ranks=(2,),
    max_position=None,
    allowed=None,
):
    """One check of an encoder's input dict, shared by every entry point.

    Shapes and dtypes are checked in every call, values when they are
    concrete (compiled steps, which cannot raise on values, give NaN rows for
    out-of-range ids: see `TransformerEmbedding`). Checked, for the keys present:

    * ``token_ids``: integer ``(batch, sequence)`` in ``[0, vocabulary_size)``,
      at most ``max_position`` long when it is given;
    * ``padding_mask``: the shape of ``token_ids``, 0s and 1s (int, bool or
      float);
    * ``segment_ids``: integer, the shape of ``token_ids``, in
      ``[0, num_segments)``;
    * ``position_ids``: integer ``(batch or 1, sequence)`` (or ``(..., 2)``
      when ``position_ranks`` allows rank 3), in ``[0, max_position)`` when
      ``max_position`` is given.

    Args:
        inputs: a dict of tensors or arrays.
        vocabulary_size: int, the token vocabulary's size.
        num_segments: int, the segment vocabulary's size (0: not checked).
        required: keys that must be present.
        position_ranks: the allowed ranks of ``position_ids``.
        max_position: the absolute position table's size (the longest
            sequence, the exclusive upper bound of ``position_ids``) or None.
        allowed: the keys the model takes, or None for any; another key is
            refused (Keras matches an unknown key of a functional model's
            input dict to another input by position, silently).

    Raises:
        ValueError: naming the input, what was expected and what was received.

    Example:

    >>> check_encoder_inputs({"token_ids": [[5, 7]], "padding_mask": [[1, 0.5]]}, 10)
    Traceback (most recent call last):
    ...
    ValueError: Expected padding_mask of 0s and 1s. Received: padding_mask with the values [0.5].
    """
    if not isinstance(inputs, Mapping):
        raise ValueError(
            f"Expected a dict of inputs with the keys {list(required)}. "
            f"Received: inputs of type {type(inputs).__name__}."
        )
    check_input_keys(inputs, allowed)
    missing = [key for key in required if key not in inputs or inputs[key] is None]
    if missing:
        raise ValueError(
            f"Expected a dict of inputs with the keys {list(required)}. Received: the keys "
            f"{sorted(inputs)} (missing {missing})."
        )
    token_ids = inputs.get("token_ids")
    if token_ids is None:
        return
    check_integer_ids("token_ids", token_ids)
    shape = static_shape(token_ids)
    if len(shape) != 2:
        raise ValueError(
            f"Expected token_ids of shape (batch, sequence). Received: token_ids.shape={shape}."
        )
    for name in ("padding_mask", "segment_ids"):
        value = inputs.get(name)
        if value is None:
            continue
        other = static_shape(value)
        if len(other) != 2 or not dims_match(other, shape):
            raise ValueError(
                f"Expected {name} of the shape of token_ids {shape}. "
                f"Received: {name}.shape={other}."
            )
    position_ids = inputs.get("position_ids")
    if max_position is not None:
        check_sequence_length(shape[1], max_position)
    if position_ids is not None:
        other = static_shape(position_ids)
        ok = len(other) in position_ranks and len(other) >= 2
        if not (ok and dims_match(other, shape + (2,), broadcast_batch=True)):
            shapes = {2: "(batch or 1, sequence)", 3: "(batch or 1, sequence, 2)"}
            expected = " or ".join(shapes[rank] for rank in position_ranks)
            raise ValueError(
                f"Expected position_ids of shape {expected} with sequence = {shape[1]}. "
                f"Received: position_ids.shape={other}."
            )
        check_integer_ids("position_ids", position_ids)
        if max_position is not None:
            check_ids_in_range(position_ids, max_position, "position_ids", "max_sequence_length")
    if inputs.get("segment_ids") is not None:
        check_integer_ids("segment_ids", inputs["segment_ids"])
        if num_segments:
            check_ids_in_range(inputs["segment_ids"], num_segments, "segment_ids", "num_segments")
    if inputs.get("padding_mask") is not None:
        check_zero_one("padding_mask", inputs["padding_mask"])
    check_ids_in_range(token_ids, vocabulary_size, "token_ids", "vocabulary_size")


def check_sequence_length(length, max_sequence_length):
    """Refuses a sequence longer than an absolute position table.

    Called where the length is known (concrete data before a step compiles,
    a trace with a static length); a compiled step traced with an unknown
    length cannot raise, and the positions past the table give NaN rows, as
    out-of-range ids do.

    Args:
        length: int or None (unknown: not checked).
        max_sequence_length: int, the position table's size.

    Example:

    ```python
    try:
        check_sequence_length(30, 24)
    except ValueError as error:
        print(error)  # The sequence has 30 tokens but ... max_sequence_length=24.
    ```
    """
    if length is not None and length > max_sequence_length:
        raise ValueError(
            f"The sequence has {length} tokens but this model has absolute position "
            f"embeddings for at most max_sequence_length={max_sequence_length}."
        )


def check_input_keys(inputs, allowed):
    """Refuses a key of ``inputs`` outside ``allowed`` (None: any key).

    Args:
        inputs: a dict of inputs.
        allowed: the keys the model takes, or None.

    Example:
    ```python
    try:
        check_input_keys({"token_ids": 1, "labels": 2}, ["token_ids", "padding_mask"])
    except ValueError as error:
        print(error)  # ... Received: the unknown key(s) ['labels'], which the model ...
    ```
    """
    if allowed is None or not isinstance(inputs, Mapping):
        return
    unknown = sorted(set(inputs) - set(allowed))
    if unknown:
        raise ValueError(
            f"Expected inputs with the keys {sorted(allowed)}. Received: the unknown key(s) "
            f"{unknown}, which the model does not use (labels go in `y`)."
        )


def _checking_data(name, labelled=False):
    """The Model method ``name``, checking concrete dict data ``x`` (and labels ``y``) first."""

    def method(self, x=None, *args, **kwargs):
        self._check_data(x)
        if labelled:
            self.check_labels(args[0] if args else kwargs.get("y"))
        with weights_kept_on_error(self, trains=name == "train_on_batch"):
            return getattr(super(ConcreteInputChecks, self), name)(x, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


class ConcreteInputChecks:
    """Mixin: a model that checks its inputs at every entry point.

    ``model(inputs)`` checks them in `call` (shapes and dtypes always, values
    when eager); ``fit``, ``evaluate``, ``predict`` and the ``*_on_batch``
    methods check concrete dict inputs (numpy arrays) before the first step
    compiles, where values can no longer raise. Subclasses define
    ``check_inputs(inputs)``.
    """

    def check_inputs(self, inputs):
        raise NotImplementedError

    def check_labels(self, labels):
        """Checks concrete labels ``y`` before a step compiles; the default checks none."""

    def _check_data(self, x):
        """Checks ``x`` when it is a dict of concrete values (numpy, lists, eager
        tensors), raw text through the preprocessor's ``check_raw_inputs``, and
        a list or tuple where a dict is expected (before a step compiles: on
        JAX, an error inside the step leaves the model without its weights)."""
        preprocessor = getattr(self, "preprocessor", None)
        if preprocessor is not None and hasattr(preprocessor, "check_raw_inputs"):
            preprocessor.check_raw_inputs(x)
        if isinstance(x, Mapping) and all(
            value is None or concrete_value(value) is not None for value in x.values()
        ):
            self.check_inputs(x)
        elif isinstance(x, (list, tuple)) and preprocessor is None:
            self.check_inputs(x)

    def call(self, inputs, training=None, mask=None, **kwargs):
        # `training` and `mask` named: Keras passes them only to a call whose
        # signature has them (with `*args` alone, dropout and DropToken would
        # never see training=True inside a model).
        self.check_inputs(inputs)
        return super().call(inputs, training=training, mask=mask, **kwargs)

    def fit(self, x=None, *args, **kwargs):
        y = args[0] if args else kwargs.get("y")
        self._check_data(x)
        self.check_labels(y)
        validation = kwargs.get("validation_data")
        if isinstance(validation, (tuple, list)) and validation:
            self._check_data(validation[0])
            if len(validation) > 1:
                self.check_labels(validation[1])
        build_optimizer(self, x, y)  # one trace of the first step on TensorFlow, not two
        with weights_kept_on_error(self, trains=True):
            return super().fit(x, *args, **kwargs)

    evaluate = _checking_data("evaluate", labelled=True)
    predict = _checking_data("predict")
    train_on_batch = _checking_data("train_on_batch", labelled=True)
    test_on_batch = _checking_data("test_on_batch", labelled=True)
    predict_on_batch = _checking_data("predict_on_batch")
