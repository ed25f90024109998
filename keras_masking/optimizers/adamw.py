"""AdamW with exact updates of embedding rows on TensorFlow and schedules in updates."""

import math
import numbers

import keras

from keras_masking.optimizers.dense_gradients import densify_gradients
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_str_list


@keras.saving.register_keras_serializable(package="keras_masking")
class AdamW(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` whose embedding-row updates are exact on TensorFlow.

    The same arguments and update as Keras' AdamW, except two things. On
    TensorFlow the gradients of embedding lookups are summed per row before
    the update (see `densify_gradients`): Keras squares them slice by slice,
    so a row looked up ``k`` times moves up to ``sqrt(k)`` times too far.
    And a `LearningRateSchedule` is evaluated at the number of updates
    applied (``optimizer.iterations``), not at Keras' batch counter, which
    runs ``k`` times faster under ``gradient_accumulation_steps=k``; so are
    the moving averages of ``use_ema`` (Keras averages after every batch,
    which made the momentum ``m**k`` per update). Every
    argument is checked before anything is built (``epsilon`` > 0: with 0,
    an embedding row no example looked up would become NaN).
    docs/distributed.md measures both defects.

    Args:
        learning_rate: float > 0, or a
            `keras.optimizers.schedules.LearningRateSchedule` (or a callable
            of no argument). A schedule is evaluated at steps 0 and 1 when
            the optimizer is made, and a NaN, infinite or negative rate is
            refused; one that turns NaN later makes the weights NaN, as with
            Keras' optimizers (`keras.callbacks.TerminateOnNaN` stops such a
            ``fit``; the CLUE runner stops a diverging run itself).
        weight_decay: float >= 0.
        beta_1: float in [0, 1).
        beta_2: float in [0, 1).
        epsilon: float > 0.
        amsgrad: bool.
        clipnorm, clipvalue, global_clipnorm: None or a float > 0 (one of
            them at most).
        use_ema: bool.
        ema_momentum: float in [0, 1].
        ema_overwrite_frequency: None or an int >= 1.
        loss_scale_factor: None or a float > 0.
        gradient_accumulation_steps: None or an int >= 1 (1 is None: no
            accumulation). Refused under the ``mixed_float16`` policy, whose
            loss scaling skips overflowing micro-batches uncounted
            (``mixed_bfloat16`` has none).
        name: the optimizer's name, or None.
        exclude_from_weight_decay_names: None or a list of strings, as
            ``exclude_from_weight_decay(var_names=...)``; kept in the config,
            so a saved model's optimizer loads with them (Keras' AdamW keeps
            them outside its config: a loaded model decayed its biases and
            LayerNorms).
        **kwargs: ``clipnorm`` to ``name`` above, and the other
            `keras.optimizers.Optimizer` arguments.

    Example:

    >>> optimizer = AdamW(learning_rate=1e-3, weight_decay=0.01)
    >>> float(optimizer.weight_decay)
    0.01
    """

    def __init__(
        self,
        learning_rate=0.001,
        weight_decay=0.004,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-7,
        amsgrad=False,
        exclude_from_weight_decay_names=None,
        **kwargs,
    ):
        super().__init__(
            learning_rate=_check_learning_rate(learning_rate),
            weight_decay=check_float("weight_decay", weight_decay, minimum=0.0),
            beta_1=check_float("beta_1", beta_1, 0.0, 1.0, open_maximum=True),
            beta_2=check_float("beta_2", beta_2, 0.0, 1.0, open_maximum=True),
            epsilon=check_float("epsilon", epsilon, minimum=0.0, open_minimum=True),
            amsgrad=check_bool("amsgrad", amsgrad),
            **_check_optimizer_arguments(kwargs),
        )
        _check_loss_scaled_accumulation(self)
        self.exclude_from_weight_decay_names = None
        if exclude_from_weight_decay_names is not None:
            self.exclude_from_weight_decay(var_names=exclude_from_weight_decay_names)

    def get_config(self):
        return {
            **super().get_config(),
            "exclude_from_weight_decay_names": self.exclude_from_weight_decay_names,
        }

    def build(self, var_list):
        _check_loss_scaled_accumulation(self)  # the policy may have changed since
        super().build(var_list)

    def _get_current_learning_rate(self):
        if isinstance(self._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            return self._learning_rate(self.iterations)
        return super()._get_current_learning_rate()

    def _all_reduce_sum_gradients(self, grads_and_vars):
        # TensorFlow only (Keras' TensorFlow optimizer calls this before each
        # update). Keras all-reduces the gradients even outside any strategy,
        # and with dense gradients (all of ours) TensorFlow's all-reduce goes
        # through a graph-mode `tf.custom_gradient`, which registers each traced
        # step's gradient function in a process-wide registry: every `fit`'s
        # train graph, and the model and optimizer variables it holds, then
        # stay in memory until the process ends. Outside a strategy there is
        # one replica and the sum is the gradients themselves.
        import tensorflow as tf

        if not tf.distribute.has_strategy():
            return list(grads_and_vars)
        return super()._all_reduce_sum_gradients(grads_and_vars)

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        """Keras' `exclude_from_weight_decay`, with its arguments checked.

        ``var_names`` must be a list of strings: a string alone would be
        matched character by character (``"bias"`` excluding every variable
        whose name holds a b, i, a or s). The names are kept in the config
        (``exclude_from_weight_decay_names``); a ``var_list`` is not (a saved
        model's variables are new objects when it loads). Each call replaces
        the exclusions of the one before, as Keras' does.

        Args:
            var_list: None or a list of variables to exclude.
            var_names: None or a list of strings, regular expressions searched
                in each variable's name (its own name, ``"gamma"``, not its
                path): ``"bias"`` excludes every variable whose name holds it.

        Example:

        >>> optimizer = AdamW(1e-3)
        >>> optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
        """
        if var_names is not None:
            var_names = check_str_list("var_names", var_names)
        if var_list is not None and not isinstance(var_list, (list, tuple)):
            raise ValueError(
                f"Expected a list of variables for var_list. Received: var_list={var_list!r}."
            )
        super().exclude_from_weight_decay(var_list=var_list, var_names=var_names)
        # Keras replaces the exclusions at each call: so does the config (a second call
        # with other names, or none, left the first names there for a loaded model).
        self.exclude_from_weight_decay_names = sorted(set(var_names)) if var_names else None

    def finalize_variable_values(self, var_list):
        """Keras' ``finalize_variable_values``, writing copies of the moving averages.

        With ``use_ema``, Keras assigns each average itself to its variable at
        the end of ``fit``; on JAX the two then hold one buffer, which the next
        compiled step donates twice, so a second ``fit`` failed ("'NoneType'
        object is not callable").

        Args:
            var_list: the model's trainable variables, in the optimizer's order.
        """
        if not self.use_ema:
            return super().finalize_variable_values(var_list)
        for variable, average in zip(var_list, self._model_variables_moving_average):
            if average is not None:
                variable.assign(keras.ops.copy(average))

    def _update_model_variables_moving_average(self, trainable_variables):
        # Keras averages after every micro-batch, but the weights move once per
        # update: k averagings of the same weights made the momentum m**k.
        steps = self.gradient_accumulation_steps
        if not (self.use_ema and steps):
            return super()._update_model_variables_moving_average(trainable_variables)
        update = keras.ops.cast(keras.ops.equal((self._iterations + 1) % steps, 0), "float32")
        later = keras.ops.cast(keras.ops.not_equal(self.iterations, 0), "float32")
        momentum = 1.0 - update * (1.0 - later * self.ema_momentum)  # 1 between updates
        for variable, average in zip(trainable_variables, self._model_variables_moving_average):
            if average is not None:
                kept = keras.ops.cast(momentum, variable.dtype)
                average.assign(kept * average + (1.0 - kept) * variable)

    def apply(self, grads, trainable_variables=None):
        _check_tf_distribute(self)
        variables = trainable_variables
        if variables is None and self.built:
            variables = self._trainable_variables
        return super().apply(densify_gradients(grads, variables), trainable_variables)


def _check_tf_distribute(optimizer):
    """What Keras' optimizer cannot do under a `tf.distribute` strategy, said clearly.

    Gradient accumulation fails inside a replicated step (TensorFlow's
    "merge_call called while defining a new graph"), and an optimizer made
    outside the strategy's scope fails with "Mixing different
    tf.distribute.Strategy objects".
    """
    if keras.backend.backend() != "tensorflow":
        return
    import tensorflow as tf

    if not tf.distribute.has_strategy():
        return
    steps = optimizer.gradient_accumulation_steps
    if steps:
        raise ValueError(
            f"gradient_accumulation_steps={steps} cannot run under a tf.distribute strategy "
            "(Keras' accumulation calls merge_call inside the replicated step). Use a global "
            "batch that many times larger across the replicas instead, or accumulate on one "
            "device."
        )
    # Keras' TensorFlow optimizer keeps the strategy it was made under.
    made_under = getattr(optimizer, "_distribution_strategy", None)
    if made_under is not None and made_under is not tf.distribute.get_strategy():
        raise ValueError(
            "This optimizer was made outside the tf.distribute strategy it now runs under. "
            "Make it inside `with strategy.scope():`, as the model."
        )


def _check_loss_scaled_accumulation(optimizer):
    """Refuses gradient accumulation under the mixed_float16 policy.

    Keras' `LossScaleOptimizer` (which `compile` adds under that policy)
    skips a micro-batch whose scaled gradients overflow without counting it:
    every later group of micro-batches then shifts by one, an update is lost
    and a micro-batch's gradients are left over.
    """
    steps = optimizer.gradient_accumulation_steps
    if steps and keras.config.dtype_policy().name == "mixed_float16":
        raise ValueError(
            f"gradient_accumulation_steps={steps} cannot run under the mixed_float16 dtype "
            "policy: Keras' LossScaleOptimizer skips a micro-batch whose gradients overflow "
            "without counting it, which shifts every later accumulation group (an update lost, "
            "a micro-batch's gradients left over). Use mixed_bfloat16 (no loss scaling) or a "
            "batch that many times larger."
        )


def _check_optimizer_arguments(kwargs):
    """The base `keras.optimizers.Optimizer` arguments among ``kwargs``, checked."""
    kwargs = dict(kwargs)
    for name in ("clipnorm", "clipvalue", "global_clipnorm", "loss_scale_factor"):
        if kwargs.get(name) is not None:
            kwargs[name] = check_float(name, kwargs[name], minimum=0.0, open_minimum=True)
    if "use_ema" in kwargs:
        kwargs["use_ema"] = check_bool("use_ema", kwargs["use_ema"])
    if "ema_momentum" in kwargs:
        kwargs["ema_momentum"] = check_float("ema_momentum", kwargs["ema_momentum"], 0.0, 1.0)
    for name in ("ema_overwrite_frequency", "gradient_accumulation_steps"):
        if kwargs.get(name) is not None:
            kwargs[name] = check_int(name, kwargs[name], minimum=1)
    if kwargs.get("gradient_accumulation_steps") == 1:
        kwargs["gradient_accumulation_steps"] = None  # one step: no accumulation
    return kwargs


def _check_learning_rate(value):
    if isinstance(value, keras.optimizers.schedules.LearningRateSchedule):
        # A compiled step cannot raise: a NaN rate would turn every weight NaN.
        for step in (0, 1):
            rate = float(keras.ops.convert_to_numpy(value(step)))
            if not math.isfinite(rate) or rate < 0:
                raise ValueError(
                    "Expected a learning-rate schedule with finite rates >= 0. Received: a "
                    f"{type(value).__name__} whose rate at step {step} is {rate}."
                )
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return check_float("learning_rate", value, minimum=0.0, open_minimum=True)
    if callable(value):
        return value
    raise ValueError(
        "Expected a number > 0, a LearningRateSchedule or a callable for learning_rate. "
        f"Received: learning_rate={value!r}."
    )
