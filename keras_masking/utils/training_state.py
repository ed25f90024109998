"""A compiled model's training state brought in step with a method turned on late."""

import collections
import contextlib
import copy
import logging
import weakref
from collections.abc import Mapping

import keras
import numpy as np
from keras.src.backend.common import global_state

logger = logging.getLogger("keras_masking")

#: Optimizer settings Keras keeps outside `get_config` (set by
#: ``exclude_from_weight_decay``).
_UNCONFIGURED_OPTIMIZER_SETTINGS = (
    "_exclude_from_weight_decay",
    "_exclude_from_weight_decay_pattern",
)


def unbuilt_optimizer_copy(optimizer):
    """A new, unbuilt optimizer with ``optimizer``'s configuration and exclusions.

    ``exclude_from_weight_decay`` is kept outside the optimizer's config, so
    ``from_config`` alone would lose it; a `LossScaleOptimizer` keeps its
    inner optimizer's exclusions too.

    Args:
        optimizer: a `keras.optimizers.Optimizer`.

    Example:
    ```python
    optimizer = keras.optimizers.AdamW(1e-3)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    assert not keras_masking.utils.unbuilt_optimizer_copy(optimizer).built
    ```
    """
    fresh = type(optimizer).from_config(optimizer.get_config())
    pairs = [(optimizer, fresh)]
    if hasattr(optimizer, "inner_optimizer"):  # LossScaleOptimizer
        pairs.append((optimizer.inner_optimizer, fresh.inner_optimizer))
    for source, target in pairs:
        for name in _UNCONFIGURED_OPTIMIZER_SETTINGS:
            if hasattr(source, name):
                setattr(target, name, copy.copy(getattr(source, name)))
        target._exclude_from_weight_decay_cache = {}
    return fresh


def build_optimizer(model, x=None, y=None):
    """Builds ``model``, its metrics and its optimizer before ``fit`` traces a step.

    Keras' TensorFlow trainer builds an unbuilt model, the compiled metrics
    and losses, and the optimizer inside the first traced train step, and
    ``tf.function`` traces a function that created variables a second time:
    the first ``fit`` traces and optimizes the whole step twice. Built
    beforehand (what Keras' JAX trainer always does, from a symbolic batch),
    it is traced once (benchmarks/first_fit.py). With ``x`` a dict of arrays,
    or the raw inputs of a model with a preprocessor and a feature-dict
    input, and with the labels ``y`` when the model was compiled with a loss,
    everything is built from the batch's shapes (the batch size left open,
    as in the traced step); otherwise only the optimizer of a built model.
    The package's models call this in ``fit``; it does nothing on other
    backends, without an optimizer, or when the optimizer is built. A
    compiled model first gets `restart_loaded_lora` (on every backend).

    Args:
        model: a `keras.Model`, compiled or not.
        x: optional, the inputs ``fit`` is given.
        y: optional, the labels ``fit`` is given.

    Example:
    ```python
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(True))
    keras_masking.utils.build_optimizer(model, features, labels)
    model.fit(features, labels, verbose=0)  # on TensorFlow: one trace of the step
    ```
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        # A loaded model's LoRA trains again, its optimizer built (a saved
        # compiled model) or not.
        restart_loaded_lora(model)
    if keras.config.backend() != "tensorflow" or optimizer is None or optimizer.built:
        return
    batch = _symbolic_batch(model, x, y)
    # Keras' own build from a symbolic batch (its JAX trainer's, and its
    # TensorFlow trainer's under a distribution strategy).
    symbolic_build = getattr(model, "_symbolic_build", None)
    if batch is not None and callable(symbolic_build):
        with model.distribute_strategy.scope():
            symbolic_build(data_batch=batch)
        return
    if model.built:
        with model.distribute_strategy.scope():
            optimizer.build(model.trainable_variables)


def restart_loaded_lora(model):
    """Gives LoRA's ``A`` kernels fresh values where loading left LoRA unable to train.

    Keras saves a LoRA layer's kernel with its low-rank update merged in and
    loads both LoRA kernels as zeros; with ``A`` and ``B`` both zero neither
    has a gradient, so the next ``fit`` would train everything but LoRA.
    Each such layer's ``A`` gets He-uniform values, as ``enable_lora`` gives
    it; ``B`` stays zero, so the model's outputs do not change. Layers whose
    LoRA kernels are not both zero are left alone. `build_optimizer` (which
    the package's models run in ``fit``) and `refresh_training` run it; call
    it before fitting your own model after ``keras.saving.load_model`` or
    ``from_preset``.

    Args:
        model: a `keras.Model` or layer.

    Returns:
        The number of layers whose ``A`` kernel was restarted.

    Example:
    ```python
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(True))
    restarted = keras_masking.utils.restart_loaded_lora(model)  # 0: nothing was loaded
    ```
    """
    restarted = 0
    for layer in model._flatten_layers(include_self=True):
        if not getattr(layer, "lora_enabled", False):
            continue
        kernel_a, kernel_b = layer.lora_kernel_a, layer.lora_kernel_b
        if np.any(keras.ops.convert_to_numpy(kernel_a)) or np.any(
            keras.ops.convert_to_numpy(kernel_b)
        ):
            continue
        kernel_a.assign(keras.initializers.HeUniform()(kernel_a.shape, kernel_a.dtype))
        restarted += 1
    if restarted:
        logger.info("LoRA restarted on %d layer(s) loaded with zero LoRA kernels.", restarted)
    return restarted


def _spec(value):
    """A `keras.KerasTensor` of ``value``'s shape (batch open) and dtype, or None."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None or len(shape) < 1:
        return None
    try:
        dtype = keras.backend.standardize_dtype(dtype)
    except ValueError:  # strings, objects: a preprocessor's input, not the step's
        return None
    return keras.KerasTensor((None, *tuple(shape)[1:]), dtype=dtype)


def _symbolic_batch(model, x, y):
    """``(x, y, None)`` as symbolic tensors of a batch of the train step, or None."""
    raw = not isinstance(x, Mapping)
    if raw:
        # A task's preprocessor gives the functional model's input dict.
        if getattr(model, "preprocessor", None) is None:
            return None
        try:
            x = model.input
        except (AttributeError, ValueError):  # a model without one: Keras raises
            return None
        if not isinstance(x, Mapping):
            return None
    features = {name: _spec(value) for name, value in x.items()}
    if not features or any(spec is None for spec in features.values()):
        return None
    if y is None:
        # Labels from a preprocessor or a dataset are not known here.
        unlabelled = not raw and getattr(model, "loss", None) is None
        return (features, None, None) if unlabelled else None
    if isinstance(y, Mapping):  # one label per named output
        labels = {name: _spec(value) for name, value in y.items()}
        known = all(spec is not None for spec in labels.values())
    else:
        labels = _spec(np.asarray(y) if isinstance(y, (list, tuple)) else y)
        known = labels is not None
    return (features, labels, None) if known else None


def refresh_training(model):
    """Makes ``model``'s next ``fit``, ``evaluate`` and ``predict`` follow its layers as they are.

    Keras traces a model's train, test and predict steps once and builds the
    optimizer over the variables that were trainable at the first ``fit``;
    a method turned on afterwards (new weights, other ``trainable`` flags,
    another training graph) would be ignored by both. This drops the traced
    steps and, when the optimizer was built, gives the model a new optimizer
    of the same configuration built over the current trainable variables,
    with the step count (so a learning-rate schedule goes on where it was)
    and the slots (moments) of every variable that still trains carried
    over. The ``enable_*`` calls of the package's models and backbones run
    it on every model that has called them, so users rarely need it; call
    it yourself after changing ``trainable`` flags by hand instead of
    compiling again.

    Args:
        model: a `keras.Model`, compiled or not.

    Example:
    ```python
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(True))
    model.fit(features, labels, verbose=0)
    model.layers[-1].trainable = False  # say, the head
    keras_masking.utils.refresh_training(model)
    model.fit(features, labels, verbose=0)  # the head stays; the optimizer's state goes on
    ```
    """
    for name in ("train_function", "test_function", "predict_function"):
        if getattr(model, name, None) is not None:
            setattr(model, name, None)
    rebuild = getattr(model, "rebuild_training_graph", None)
    if callable(rebuild):
        rebuild()
    restart_loaded_lora(model)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not getattr(optimizer, "built", False):
        return
    fresh = unbuilt_optimizer_copy(optimizer)
    fresh.build(model.trainable_variables)
    # A slot is named after its variable's path: a path that two variables
    # share (layers built outside their parent's name scope) names no one
    # variable, and those slots start afresh rather than take another's.
    previous, shared = _by_unique_path(optimizer.variables, _slot_key(optimizer))
    current, shared_now = _by_unique_path(fresh.variables, _slot_key(fresh))
    carried = set()
    for path, variable in current.items():
        source = previous.get(path)
        if source is not None and tuple(source.shape) == tuple(variable.shape):
            # A copy: on JAX an assigned array is shared, and the next compiled
            # step donates (deletes) the buffers of the optimizer it trains.
            variable.assign(np.array(source.numpy()))
            carried.add(id(variable))
    _start_new_averages(fresh, model.trainable_variables, carried)
    if shared or shared_now:
        counts = collections.Counter(variable.path for variable in model.trainable_variables)
        logger.warning(
            "refresh_training: %d optimizer slot(s) start again from zero: variables of the "
            "model share the paths %s, so their slots cannot be told apart. Build each layer "
            "under its parent (keras.name_scope) to give every variable its own path.",
            sum(len(variables) for variables in shared_now.values()),
            sorted(path for path, count in counts.items() if count > 1)[:3],
        )
    model.optimizer = fresh
    _compile_with(model, optimizer, fresh)
    if getattr(model, "compiled", False):
        # Keras compares the flags with these at fit time (a warning on change).
        model._compiled_trainable_state = {
            layer: layer.trainable for layer in model._flatten_layers()
        }


def _start_new_averages(optimizer, variables, carried):
    """Starts the moving averages (``use_ema``) of the variables that had none at
    the variables' values.

    Keras sets an average to its variable at the first step only; a fresh
    optimizer that carries a later step count would start a new variable's
    average at zero, and the fit's end would write that shrunk average into
    the variable (2% of its value after two steps at momentum 0.99). Keras
    keeps the averages in build order, in no public attribute.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
    averages = getattr(inner, "_model_variables_moving_average", None) or ()
    for variable, average in zip(variables, averages):
        if id(average) not in carried:
            average.assign(np.array(variable.numpy()))


def _compile_with(model, previous, fresh):
    """Puts ``fresh`` in ``model``'s compile config where ``previous`` was.

    ``model.save`` writes the optimizer ``compile`` was given (Keras keeps no
    public handle on it), so it must be the one that trains now; a
    `LossScaleOptimizer` that Keras added around it is not in the config.
    """
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    if not isinstance(config, dict):
        return
    if config.get("optimizer") is previous:
        config["optimizer"] = fresh
    elif config.get("optimizer") is getattr(previous, "inner_optimizer", None):
        config["optimizer"] = fresh.inner_optimizer


def _slot_key(optimizer):
    """A variable's path under ``optimizer``, the same however it was built.

    Keras builds a `LossScaleOptimizer`'s inner optimizer in the outer one's
    scope inside a traced TensorFlow step (``loss_scale_optimizer/adam_w/...``)
    and outside it otherwise (``adam_w/...``): the outer name is dropped
    where the inner one follows it.
    """
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is None:
        return lambda path: path
    nested = f"{optimizer.name}/{inner.name}/"
    return lambda path: path[len(optimizer.name) + 1 :] if path.startswith(nested) else path


def _by_unique_path(variables, key):
    """``({key: variable} of the keys held once, {key: [variables]} of the others)``,
    keyed by ``key(variable.path)``."""
    by_path = collections.defaultdict(list)
    for variable in variables:
        by_path[key(variable.path)].append(variable)
    unique = {path: found[0] for path, found in by_path.items() if len(found) == 1}
    return unique, {path: found for path, found in by_path.items() if len(found) > 1}


def outermost_caller(default=None):
    """The outermost layer or model being called right now, or ``default``.

    Reads Keras' call context (there is no public hook) without creating
    one: a model run through ``stateless_call`` (JAX's ``fit`` and
    ``predict``) calls its layers' ``call`` with no context open, and a
    context opened there would never be closed, leaving the next calls
    in the process with a stale ``training`` flag.

    Args:
        default: what to return when no call is in progress (typically the
            layer asking, which is then the outermost one).

    Example:
    ```python
    assert keras_masking.utils.outermost_caller(default="none") == "none"
    ```
    """
    context = global_state.get_global_attribute("current_call_ctx")
    if context is None:
        return default
    return getattr(context, "entry_layer", default)


class CallerRecord:
    """The models a layer was called from, kept weakly.

    A layer that a method changes after those models traced their steps
    (`TransformerBackbone`'s ``enable_*`` calls) refreshes each of them with
    `refresh_training`, so no caller keeps training the old graph or the old
    trainable set.

    Example:
    ```python
    callers = CallerRecord()
    callers.add(model)
    callers.refresh()  # refresh_training(model), if it is still alive
    ```
    """

    def __init__(self):
        self._models = weakref.WeakSet()

    def add(self, model):
        """Records ``model`` (None is ignored).

        Args:
            model: a `keras.Model` (or layer) that called the layer.
        """
        if model is not None:
            self._models.add(model)

    def __iter__(self):
        """The recorded models that are still alive."""
        return iter(list(self._models))

    def refresh(self):
        """Runs `refresh_training` on every recorded model that is compiled or callable."""
        for model in list(self._models):
            if hasattr(model, "train_function") or hasattr(model, "optimizer"):
                refresh_training(model)


@contextlib.contextmanager
def weights_kept_on_error(model, trains=True):
    """Puts back the weights an error inside a JAX step would take from ``model``.

    Keras' JAX ``fit``, ``evaluate`` and ``predict`` take the values out of the
    model's variables before the first step runs (the step is stateless) and
    put them back when the call ends. An error raised by a step (while it
    traces a batch of other shapes from ``tf.data``, or a layer's refusal)
    left every variable empty: the model could not predict or save again.
    On JAX, after an error, each variable gets the value of the last step
    that finished (Keras' `jax_state_sync`: what ``fit`` had trained stays)
    or, where no step finished, the value it held before the call (a
    reference kept, no copy); metrics the call created start again from
    zero. For a training call (``trains=True``) a compiled model's unbuilt
    optimizer is built first, as `fit` would, so that its values are kept
    too; pass ``trains=False`` around ``predict`` or ``evaluate``, which
    leave the optimizer unbuilt (you may still change ``trainable`` flags
    before the first ``fit``). Other backends keep their variables through
    an error; nothing is done.

    Args:
        model: a `keras.Model`.
        trains: bool, whether the call trains (``fit``, ``train_on_batch``).

    Example:
    ```python
    with weights_kept_on_error(model):
        model.fit(features, labels)  # an error here leaves the model its weights
    with weights_kept_on_error(model, trains=False):
        model.predict(features)
    ```
    """
    if keras.config.backend() != "jax":
        yield
        return
    optimizer = getattr(model, "optimizer", None)
    if trains and optimizer is not None and not optimizer.built and model.built:
        # What Keras' `fit` would build first, built here so its values are kept too.
        optimizer.build(model.trainable_variables)
    kept = [(variable, variable.value) for variable in _stateful_variables(model)]
    steps_before = _optimizer_steps(model) if trains else None
    # Keras' JAX `evaluate` and `predict` record each finished step's state in
    # `_jax_state` (a new dict per step; no public way to tell whether one
    # finished). A state an earlier call left (`train_on_batch`) must not come
    # back; a training call shows its finished steps in the optimizer's count.
    state_before = getattr(model, "_jax_state", None)
    try:
        yield
    except BaseException:
        if steps_before is not None:
            stepped = (_optimizer_steps(model) or 0) > steps_before
        else:
            state = getattr(model, "_jax_state", None)
            stepped = state is not None and state is not state_before
        _restore_after_error(model, kept, stepped)
        raise


def _optimizer_steps(model):
    """The optimizer's step count, or None (no built optimizer, or emptied)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not optimizer.built or _emptied(optimizer.iterations):
        return None
    return int(keras.ops.convert_to_numpy(optimizer.iterations.value))


def _stateful_variables(model):
    """The variables Keras' JAX steps take out of ``model``: its own, its
    metrics' and its optimizer's (when built)."""
    variables = list(model.variables) + list(getattr(model, "metrics_variables", []))
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and optimizer.built:
        variables += list(optimizer.variables)
    return variables


def _emptied(variable):
    """Whether a JAX variable lost its value: emptied by Keras' trainer
    (``_value`` None: the public ``value`` fails then) or given a buffer a
    step consumed (donated)."""
    value = getattr(variable, "_value", None)
    return value is None or _deleted(value)


def _deleted(value):
    """Whether a JAX array's buffer was consumed (donated to a step)."""
    return hasattr(value, "is_deleted") and value.is_deleted()


def _restore_after_error(model, kept, stepped):
    """Gives ``model``'s variables the last finished step's values when a step
    of the failed call finished (``stepped``), else the values from before the
    call (see `weights_kept_on_error`)."""
    if stepped:
        try:
            model.jax_state_sync()  # the last finished step's state
        except Exception:  # buffers a later step consumed: `kept` where it can
            pass
    for variable, value in kept:
        if (stepped and not _emptied(variable)) or _deleted(value):
            continue
        variable.assign(value)  # no step finished: also undoes a stale sync in Keras' fit
    for metric in getattr(model, "metrics", []):
        if any(_emptied(variable) for variable in metric.variables):
            metric.reset_state()  # created by the call: no value before it
