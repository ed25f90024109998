"""ASA: adversarial self-attention fine-tuning of a user's Keras task model."""

import copy

import keras

from keras_masking.layers.attention_adversary import attention_adversaries
from keras_masking.losses.asa_divergence import ASA_TASKS
from keras_masking.models.asa_objective import TOKEN_DIVERGENCES
from keras_masking.models.asa_objective import ASAObjective
from keras_masking.models.asa_objective import asa_training_pass  # noqa: F401 (public)
from keras_masking.models.asa_objective import masked_fraction  # noqa: F401 (public)
from keras_masking.models.backbone_config import ASA_WITH_GATHER
from keras_masking.models.transformer_backbone import TransformerBackbone
from keras_masking.ops.attention_masks import validate_mask_semantics
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_seed
from keras_masking.utils.eager_checks import ConcreteInputChecks
from keras_masking.utils.eager_checks import check_input_keys
from keras_masking.utils.eager_checks import concrete_value


@keras.saving.register_keras_serializable(package="keras_masking")
class ASATrainer(ASAObjective, ConcreteInputChecks, keras.Model):
    """Fine-tunes a user's task model with adversarial self-attention (ASA).

    Wu et al. (2023), "Adversarial Self-Attention for Language
    Understanding", as its official code trains: each step runs the task
    model clean and with every attacked layer's mask set by an
    `AttentionAdversary`, and minimises ``task_loss + D(clean, adversarial)
    + tau^2 * kept units / rows`` in one backward pass; a gradient reversal
    makes the adversaries ascend what the model descends (docs/asa.md).

    This is how a user's own head on a `TransformerBackbone` trains with
    ASA: ``backbone.enable_asa(tau=...)`` (the backbone holds the setting
    and the adversaries, so the task model saves with them), then
    ``ASATrainer(task_model)`` is the model to ``compile`` and ``fit``. A
    `TransformerTextClassifier` needs no trainer. On a backbone without
    ``enable_asa`` the trainer makes its own adversaries from its
    arguments. ``training=False`` calls are the task model itself; the
    adversarial pass is a second graph built from the task model's own
    layers (``keras.models.clone_model``, layers shared).

    The logs hold ``loss`` (``task_loss + D``, as the official scripts log),
    ``mask_term``, ``divergence`` and ``masked_fraction_<layer>``. A span or
    pointer head, or several outputs, needs ``divergence=``.

    Args:
        task_model: a functional Keras model (``keras.Model(inputs, outputs)``
            or a keras-hub task) that calls a `TransformerBackbone` once (with
            token dropping, if on, in ``mode="attention"``); its outputs are
            logits (predictions for regression).
        tau, layers, alpha, mask_semantics, noise, seed: see
            `TransformerBackbone.enable_asa`. None (the default) takes the
            backbone's setting when it has one, else ``enable_asa``'s default
            (0.5, every layer, 1.0, ``"replace"``, False, None). A value that
            differs from the backbone's setting is refused, since one of the
            two would be ignored.
        task: ``"auto"`` (from the output shape: ``(B, 1)`` regression,
            ``(B, C)`` classification or multiple choice, ``(B, T, C)`` token
            classification), or one of `keras_masking.losses.ASA_TASKS`.
        divergence: None, or a callable ``(clean_outputs,
            adversarial_outputs) -> scalar`` that replaces the task kind's
            divergence (required for span or pointer heads).
        token_divergence: ``"all"`` (official: every position) or ``"real"``
            (real tokens only, a deviation) for token classification.
        **kwargs: `keras.Model` arguments (``name``).

    Example:
    ```python
    backbone.enable_asa(tau=0.5)
    outputs = backbone(backbone.input)
    logits = keras.layers.Dense(2)(outputs["pooled_output"])
    classifier = keras.Model(backbone.input, logits)
    trainer = keras_masking.methods.ASATrainer(classifier)
    trainer.compile(optimizer=keras.optimizers.AdamW(1e-5),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"], jit_compile=True)
    trainer.fit(features, labels, epochs=3)
    classifier.predict(features)  # the clean model
    ```
    """

    def __init__(
        self,
        task_model,
        tau=None,
        layers=None,
        alpha=None,
        task="auto",
        divergence=None,
        mask_semantics=None,
        noise=None,
        token_divergence="all",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        given = dict(tau=tau, alpha=alpha, mask_semantics=mask_semantics, noise=noise, seed=seed)
        given = {key: value for key, value in given.items() if value is not None}
        for name in ("tau", "alpha"):
            if name in given:
                given[name] = check_float(name, given[name], minimum=0.0)
        if "noise" in given:
            given["noise"] = check_bool("noise", noise)
        check_seed("seed", seed)
        if mask_semantics is not None:
            validate_mask_semantics(mask_semantics)
        check_choice("task", task, ("auto",) + tuple(ASA_TASKS))
        if divergence is not None and not callable(divergence):
            raise ValueError(
                f"Expected None or a callable for divergence. Received: divergence={divergence!r}."
            )
        check_choice("token_divergence", token_divergence, TOKEN_DIVERGENCES)
        backbone = _attacked_backbone(task_model)
        self.task_model = task_model
        self.backbone = backbone
        backbone.callers.add(self)  # refreshed by every enable_* call on the backbone
        if layers is not None:
            given["layers"] = backbone.layer_indices(layers)
        settings = _asa_settings(given, backbone.asa)
        self.tau = self.asa_tau = float(settings["tau"])
        self.alpha = float(settings["alpha"])
        self.attacked_layers = backbone.layer_indices(settings["layers"])
        self.layers_argument = None if layers is None else list(self.attacked_layers)
        self.mask_semantics = settings["mask_semantics"]
        self.noise = settings["noise"]
        self.seed = settings["seed"]
        self.token_divergence = token_divergence
        self.divergence_fn = divergence
        self.task = self.asa_task = (
            "custom" if divergence is not None else _resolve_task(task, task_model)
        )
        if token_divergence == "real" and self.task != "token_classification":
            raise ValueError(
                "token_divergence='real' applies to token classification only. "
                f"This trainer's task is {self.task!r}."
            )
        if backbone.asa is None:
            self.adversaries = list(
                attention_adversaries(
                    self.attacked_layers, backbone.hidden_dim, self.alpha, self.noise, self.seed
                ).values()
            )
        else:
            self.adversaries = backbone.attention_adversaries
        self.adversarial_model = self._build_adversarial_model()
        self.build_asa_trackers(self.attacked_layers)
        self.built = True

    def _build_adversarial_model(self):
        """The task graph with the backbone's call replaced by the adversarial one."""
        by_layer = dict(zip(self.attacked_layers, self.adversaries))
        captured = []

        def call_function(layer, *args, **kwargs):
            if layer is not self.backbone:
                return layer(*args, **kwargs)
            inputs = args[0] if args else kwargs["inputs"]
            outputs, masks = self.backbone.adversarial_forward(
                inputs, None, by_layer, self.mask_semantics
            )
            captured.append((masks, inputs["padding_mask"]))
            return outputs

        clone = keras.models.clone_model(
            self.task_model, clone_function=lambda layer: layer, call_function=call_function
        )
        if len(captured) != 1:
            raise ValueError(
                f"ASA needs a task model that calls its backbone once; this one calls it "
                f"{len(captured)} times."
            )
        masks, padding_mask = captured[0]
        outputs = {"adversarial": clone.output, "masks": masks, "padding_mask": padding_mask}
        return keras.Model(clone.input, outputs, name="asa_adversarial_pass")

    def rebuild_training_graph(self):
        """Builds the adversarial pass again from the backbone as it is now.

        `keras_masking.utils.refresh_training` calls it when a method is
        turned on after this trainer was built (DropToken, FL-tuning...), so
        the adversarial pass runs the same backbone as the clean pass.

        Example:
        ```python
        trainer.fit(features, labels)
        # Rebuilds the adversarial pass: the next fit trains with DropToken.
        trainer.attacked_backbone.enable_drop_token(0.1, mode="attention")
        ```
        """
        self._tracker.unlock()
        try:
            _attacked_backbone(self.task_model)  # still attackable (no gather-mode DropToken)
            self.adversarial_model = self._build_adversarial_model()
        finally:
            self._tracker.lock()

    @property
    def attacked_backbone(self):
        """The `TransformerBackbone` this trainer attacks (its task model calls it)."""
        return self.backbone

    @property
    def inference_model(self):
        """The task model: what to save, export and serve."""
        return self.task_model

    def check_inputs(self, inputs):
        """The task model's input keys, and the backbone's checks of its features.

        Run by every call, and by ``fit`` / ``evaluate`` / ``predict`` on
        numpy data before a step compiles (see `TransformerBackbone.check_inputs`):
        a key the task model does not take is refused (Keras would match it
        to another input by position), ids are checked before they reach a
        compiled step.
        """
        expected = self.task_model.input
        if not isinstance(expected, dict) or not isinstance(inputs, dict):
            return
        check_input_keys(inputs, tuple(expected))
        own = tuple(self.backbone.input)
        features = {name: value for name, value in inputs.items() if name in own}
        if len(getattr(features.get("token_ids"), "shape", (0, 0))) > 2:
            # A head that groups rows (multiple choice: (batch, choices, sequence))
            # hands the backbone the rows flattened: check them so, when concrete.
            concrete = {name: concrete_value(value) for name, value in features.items()}
            if any(value is None for value in concrete.values()):
                return  # traced: the backbone checks shapes in its own call
            features = {
                name: value.reshape(-1, value.shape[-1]) for name, value in concrete.items()
            }
        self.backbone.check_inputs(features, required=sorted(set(own) & set(expected)))

    def call(self, inputs, training=False):
        self.check_inputs(inputs)
        if not training:
            return self.task_model(inputs, training=False)
        with asa_training_pass():
            clean = self.task_model(inputs, training=True)
            passed = self.adversarial_model(inputs, training=True)
        return self.asa_training_outputs(
            clean, passed["adversarial"], passed["masks"], passed["padding_mask"]
        )

    def get_config(self):
        return {
            "task_model": keras.saving.serialize_keras_object(self.task_model),
            "tau": self.tau,
            "layers": self.layers_argument,
            "alpha": self.alpha,
            "task": "auto" if self.task == "custom" else self.task,
            "divergence": keras.saving.serialize_keras_object(self.divergence_fn),
            "mask_semantics": self.mask_semantics,
            "noise": self.noise,
            "token_divergence": self.token_divergence,
            "seed": self.seed,
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
        }

    @classmethod
    def from_config(cls, config):
        # Deserialising a functional model consumes the dict it is given:
        # keep the caller's config as it was.
        config = copy.deepcopy(config)
        config["task_model"] = keras.saving.deserialize_keras_object(config["task_model"])
        config["divergence"] = keras.saving.deserialize_keras_object(config["divergence"])
        return cls(**config)


_ASA_DEFAULTS = {"tau": 0.5, "alpha": 1.0, "mask_semantics": "replace", "noise": False}


def _asa_settings(given, backbone_setting):
    """The trainer's ASA settings: the backbone's (``enable_asa``) or the arguments.

    A value given to the trainer that differs from the backbone's setting is
    refused: one of the two would be silently ignored.
    """
    if backbone_setting is None:
        return {**_ASA_DEFAULTS, "seed": None, "layers": None, **given}
    differing = {
        key: (value, backbone_setting[key])
        for key, value in given.items()
        if backbone_setting.get(key) != value
    }
    if differing:
        details = ", ".join(
            f"{key}={mine!r} (the backbone's {key}={theirs!r})"
            for key, (mine, theirs) in sorted(differing.items())
        )
        raise ValueError(
            "This backbone has ASA's settings already (backbone.enable_asa), and the trainer was "
            f"given others: {details}. Pass none of them to the trainer (it uses the backbone's), "
            "or enable ASA on the backbone with the values you want."
        )
    return dict(backbone_setting)


def _attacked_backbone(task_model):
    """The `TransformerBackbone` the model calls (token dropping, if on, in attention mode)."""
    if isinstance(task_model, ASAObjective) and task_model.backbone.asa is not None:
        raise ValueError(
            "This model trains with ASA itself (its backbone has enable_asa): fit it directly."
        )
    functional = any(cls.__name__ == "Functional" for cls in type(task_model).__mro__)
    layers = task_model.layers if functional else []
    encoders = [layer for layer in layers if isinstance(layer, TransformerBackbone)]
    if len(encoders) != 1:
        raise ValueError(
            "ASA needs a functional task model (keras.Model(inputs, outputs), or a keras-hub "
            "task) that calls one keras_masking TransformerBackbone directly; convert a "
            "keras-hub backbone at the door with TransformerBackbone.from_keras_hub(backbone). "
            "Received: a "
            f"{type(task_model).__name__} calling {len(encoders)} such encoders (its layers: "
            f"{sorted({type(layer).__name__ for layer in layers})})."
        )
    backbone = encoders[0]
    if backbone.drop_token is not None and backbone.drop_token.mode == "gather":
        raise ValueError(ASA_WITH_GATHER)
    return backbone


def _resolve_task(task, task_model):
    """The task kind, from ``task`` or the task model's output shape."""
    outputs = task_model.outputs
    if len(outputs) != 1:
        raise ValueError(
            f"This task model has {len(outputs)} outputs; ASA's official divergences are "
            "defined for one output of logits. Pass `divergence=` (a callable of the clean and "
            "adversarial outputs)."
        )
    shape = tuple(outputs[0].shape)
    if task != "auto":
        expected_rank = 3 if task == "token_classification" else 2
        if len(shape) != expected_rank:
            raise ValueError(
                f"task={task!r} expects outputs of rank {expected_rank}; this model's output has "
                f"shape {shape}."
            )
        return task
    if len(shape) == 3:
        return "token_classification"
    if len(shape) == 2 and shape[-1] == 1:
        return "regression"
    if len(shape) == 2 and shape[-1] is not None:
        return "classification"
    raise ValueError(
        f"Cannot tell the task kind from an output of shape {shape} (a span or pointer head has "
        "no official ASA divergence). Pass task= or divergence=."
    )
