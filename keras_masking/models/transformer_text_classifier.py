"""TransformerTextClassifier: a keras-hub TextClassifier on a TransformerBackbone."""

import contextlib
import functools
import logging
import os
import pathlib
from collections.abc import Mapping

import keras
import keras_hub
import numpy as np

from keras_masking.distribution.dropout import ReplicaDropout
from keras_masking.layers.activations import gelu_as_erf
from keras_masking.layers.initializers import bert_initializer
from keras_masking.models.asa_objective import ASAObjective
from keras_masking.models.asa_objective import asa_training_pass
from keras_masking.models.backbone_loading import declared_task_class
from keras_masking.models.backbone_loading import kept_across_preset_saves
from keras_masking.models.backbone_loading import read_keras_hub_preset
from keras_masking.models.model_card import model_card
from keras_masking.models.model_card import write_model_card
from keras_masking.models.onnx_export import export_onnx
from keras_masking.models.shuffled_array_fit import ShuffledArrayFit
from keras_masking.models.text_classifier_export import export_text_classifier
from keras_masking.models.text_classifier_export import token_id_signature
from keras_masking.models.transformer_backbone import TransformerBackbone
from keras_masking.models.transformer_text_classifier_preprocessor import (
    TransformerTextClassifierPreprocessor,
)
from keras_masking.ops.label_range import nan_for_labels_out_of_range
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_model_keywords
from keras_masking.utils.eager_checks import ConcreteInputChecks
from keras_masking.utils.eager_checks import concrete_value
from keras_masking.utils.files import read_json_object
from keras_masking.utils.files import replace_folder_atomically
from keras_masking.utils.training_state import refresh_training

logger = logging.getLogger(__name__)


# The labels each of Keras' losses reads; a loss of your own (not named here)
# is taken to read class ids, as keras-hub's default loss does.
_ONE_HOT_LOSSES = (
    "categorical_crossentropy",
    "categorical_focal_crossentropy",
    "categorical_hinge",
)
_MULTI_HOT_LOSSES = ("binary_crossentropy", "binary_focal_crossentropy")
# keras_masking.losses' multi-label loss reads scores: a label where the score is above 0.
_SCORE_MULTI_HOT_LOSSES = ("multilabel_categorical_crossentropy",)
_NO_CLASS_LOSSES = (  # regression and other targets: no accuracy, no class-id check
    "mean_squared_error", "mean_absolute_error", "mean_absolute_percentage_error",
    "mean_squared_logarithmic_error", "huber", "log_cosh", "cosine_similarity", "poisson",
    "kl_divergence", "hinge", "squared_hinge", "circle", "dice", "tversky", "ctc",
)  # fmt: skip


def _loss_function(loss):
    """``(name, from_logits)`` of the function ``loss`` computes: a Keras name or
    class name, a loss object, a `functools.partial` or a plain function, alone
    or as the one entry of a list or dict (``name`` None for several)."""
    if isinstance(loss, Mapping):  # one output: {"logits": loss}
        loss = list(loss.values())
    if isinstance(loss, (list, tuple)):
        return _loss_function(loss[0]) if len(loss) == 1 else (None, False)
    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except ValueError:
            return loss, False
    from_logits = bool(getattr(loss, "from_logits", False))
    while isinstance(loss, functools.partial) or callable(getattr(loss, "fn", None)):
        if isinstance(loss, functools.partial):
            from_logits = bool(loss.keywords.get("from_logits", from_logits))
            loss = loss.func
        else:  # Keras' loss classes wrap their function (`LossFunctionWrapper.fn`)
            loss = loss.fn
    return getattr(loss, "__name__", ""), from_logits


def _sparse_loss(loss):
    """Whether a compiled loss takes class ids: Keras' sparse cross-entropy,
    or a loss of your own that Keras does not name (keras-hub's assumption)."""
    if loss is None:
        return False
    name, _ = _loss_function(loss)
    return name is not None and name not in (
        _ONE_HOT_LOSSES + _MULTI_HOT_LOSSES + _SCORE_MULTI_HOT_LOSSES + _NO_CLASS_LOSSES
    )


def _own_loss(loss):
    """Whether a compiled loss is one of your own (a function Keras does not name)."""
    name, _ = _loss_function(loss)
    return _sparse_loss(loss) and not callable(getattr(keras.losses, name, None))


@keras.saving.register_keras_serializable(package="keras_masking")
class TransformerTextClassifier(
    ASAObjective, ConcreteInputChecks, ShuffledArrayFit, keras_hub.models.TextClassifier
):
    """Sentence (pair) classification on a `TransformerBackbone`, keras-hub style.

    The head is BERT's: the backbone's ``pooled_output`` ->
    ``Dropout(dropout)`` -> ``Dense(num_classes, activation)``, the last in
    float32 whatever the dtype policy. With a
    ``preprocessor``, ``fit``, ``evaluate`` and ``predict`` take raw strings
    or pairs ``(texts_a, texts_b)``, tokenized in a ``tf.data`` pipeline so
    the step compiles once; without one they take the feature dict
    ``{"token_ids", "segment_ids", "padding_mask"}`` (``segment_ids`` is
    unused when the backbone has ``num_segments=0``).

    As a keras-hub task it is compiled on construction with keras-hub's
    defaults; ``save_to_preset`` / ``from_preset`` and ``model.save`` /
    ``keras.saving.load_model`` round-trip without ``custom_objects``.

    Each method of the package is one call on the classifier, acting on its
    backbone (see `TransformerBackbone`): `enable_drop_token`, `enable_asa`,
    `enable_fl_tuning` (`merge_fl` / `unmerge_fl` give new classifiers),
    `enable_prefix_tuning` and `enable_lora`; then ``fit`` on raw strings
    trains with it and ``predict`` is the clean model. With ASA, every
    training step also runs the adversarial pass through the same head
    (`keras_masking.models.asa_objective.ASAObjective`).

    Args:
        backbone: a `keras_masking.models.TransformerBackbone` (a keras-hub
            `BertBackbone` converts with `TransformerBackbone.from_keras_hub`).
        num_classes: int >= 2. Number of classes.
        preprocessor: a `TransformerTextClassifierPreprocessor` that fits
            the backbone (vocabulary size, sequence length), or None to feed
            token features directly.
        activation: None (logits, the default), or an activation name or
            callable applied to the outputs (``"softmax"`` for probabilities).
        dropout: float in ``[0, 1)``. Dropout on the pooled vector (0.1).
        **kwargs: base `keras_hub.models.Task` arguments (``name``,
            ``compile``, ``dtype``).

    Example:
    ```python
    from keras_masking.data import bert_tokenizer

    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("今天好坏吗")
    preprocessor = keras_masking.models.TransformerTextClassifierPreprocessor(
        bert_tokenizer(vocabulary), sequence_length=8
    )
    encoder = keras_masking.models.TransformerBackbone(
        vocabulary_size=len(vocabulary), num_layers=1, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=8,
    )
    text_classifier = keras_masking.models.TransformerTextClassifier(
        backbone=encoder, num_classes=2, preprocessor=preprocessor
    )
    texts, classes = ["今天好", "今天坏"], [1, 0]
    text_classifier.enable_fl_tuning(units=8)  # any method, one call
    text_classifier.fit(texts, classes, batch_size=2, epochs=1, verbose=0)
    text_classifier.fit((texts, ["好吗", "坏吗"]), classes, batch_size=2, verbose=0)
    logits = text_classifier.predict(texts, verbose=0)  # (2, 2)
    ```
    """

    backbone_cls = TransformerBackbone
    preprocessor_cls = TransformerTextClassifierPreprocessor

    def __init__(
        self,
        backbone,
        num_classes,
        preprocessor=None,
        activation=None,
        dropout=0.1,
        **kwargs,
    ):
        # Everything is checked before the first layer is built.
        check_model_keywords(type(self), kwargs)
        _check_backbone(backbone)
        num_classes = check_int("num_classes", num_classes, minimum=2)
        dropout = check_float("dropout", dropout, 0.0, 1.0, open_maximum=True)
        try:
            activation = keras.activations.get(activation)  # None -> linear
        except (ValueError, TypeError) as error:
            raise ValueError(
                "Expected None, an activation name or a callable for activation. "
                f"Received: activation={activation!r} ({error})"
            ) from None
        _check_preprocessor(preprocessor, backbone)

        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.output_dropout = ReplicaDropout(
            dropout, dtype=backbone.dtype_policy, name="classifier_dropout"
        )
        self.output_dense = keras.layers.Dense(
            num_classes,
            kernel_initializer=bert_initializer(),
            activation=activation,
            dtype="float32",  # logits in float32 under mixed precision
            name="logits",
        )

        # === Functional model ===
        # The inputs are the preprocessor's three features whatever the
        # backbone takes: a dict with an extra key would be matched to the
        # backbone's inputs by position, silently wrong.
        inputs = dict(backbone.input)
        if "segment_ids" not in inputs:
            inputs["segment_ids"] = keras.Input((None,), dtype="int32", name="segment_ids")
        backbone_inputs = {name: inputs[name] for name in backbone.input}
        pooled = backbone(backbone_inputs)["pooled_output"]
        outputs = self.output_dense(self.output_dropout(pooled))
        # Set before the base class compiles the model on construction: its
        # default loss reads `activation` (softmax outputs are not logits).
        self.activation = activation
        # A functional model given `trainable` sets it on every sublayer:
        # `trainable=True` from a config would unfreeze a tuned backbone.
        trainable = kwargs.pop("trainable", True)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        if not trainable:
            self.trainable = False

        # === Config ===
        self.num_classes = num_classes
        self.dropout = dropout
        if backbone.asa is not None:
            self._start_asa()

    # === Methods, one call each (on the backbone) ===
    def enable_drop_token(self, rate, **kwargs):
        """DropToken in training; see `TransformerBackbone.enable_drop_token`.

        Example:
        ```python
        classifier = keras_masking.models.TransformerTextClassifier(backbone, num_classes=3)
        classifier.enable_drop_token(0.15, unselectable_token_ids=(101, 102))
        ```
        """
        self.backbone.enable_drop_token(rate, **kwargs)
        refresh_training(self)

    def enable_asa(self, tau=0.5, layers=None, **kwargs):
        """ASA fine-tuning: ``fit`` minimises ASA's objective from now on.

        The adversaries live in the backbone (`TransformerBackbone.enable_asa`,
        same arguments); ``predict`` and ``evaluate`` are the clean pass, and
        saving keeps the adversaries so training resumes. Needs logits
        (``activation=None``).

        Example:
        ```python
        classifier = keras_masking.models.TransformerTextClassifier(backbone, num_classes=3)
        classifier.enable_asa(tau=0.5)
        classifier.fit(features, labels, batch_size=2, verbose=0)  # or raw strings
        ```
        """
        if self.activation not in (None, keras.activations.linear):
            raise ValueError(
                "ASA's divergence compares logits: build the classifier with activation=None. "
                f"Received: activation={self.activation!r}."
            )
        self.backbone.enable_asa(tau, layers, **kwargs)
        self._start_asa()
        refresh_training(self)

    def _start_asa(self):
        self.asa_task = "classification"
        self._tracker.unlock()
        try:
            self.build_asa_trackers(self.backbone.asa["layers"])
        finally:
            self._tracker.lock()

    @property
    def asa_tau(self):
        return self.backbone.asa["tau"]

    def enable_fl_tuning(self, units=160, layers=None, attention_units=0):
        """FL-tuning on the backbone (`TransformerBackbone.enable_fl_tuning`); the head trains.

        Example:
        ```python
        classifier = keras_masking.models.TransformerTextClassifier(backbone, num_classes=3)
        classifier.enable_fl_tuning(units=160)
        ```
        """
        self.backbone.enable_fl_tuning(units, layers, attention_units)
        refresh_training(self)

    def enable_prefix_tuning(self, length=160, **kwargs):
        """P-tuning v2 (`TransformerBackbone.enable_prefix_tuning`); the head trains.

        Example:
        ```python
        classifier = keras_masking.models.TransformerTextClassifier(backbone, num_classes=3)
        classifier.enable_prefix_tuning(length=16)
        ```
        """
        self.backbone.enable_prefix_tuning(length, **kwargs)
        refresh_training(self)

    def enable_lora(self, rank, target_layer_names=None):
        """keras-hub's LoRA on the backbone's query and value projections; the head trains.

        Example:
        ```python
        classifier = keras_masking.models.TransformerTextClassifier(backbone, num_classes=3)
        classifier.enable_lora(4)
        ```
        """
        self.backbone.enable_lora(rank, target_layer_names)
        refresh_training(self)

    def merge_fl(self, placement="suffix"):
        """A new classifier on ``backbone.merge_fl(placement)``, the head's weights copied.

        Example:
        ```python
        classifier = keras_masking.models.TransformerTextClassifier(backbone, num_classes=3)
        classifier.enable_fl_tuning(units=8)
        deployable = classifier.merge_fl()
        ```
        """
        return self._with_backbone(self.backbone.merge_fl(placement))

    def unmerge_fl(self, units=None, placement=None, layers=None):
        """A new classifier whose backbone is ``backbone.unmerge_fl(...)``.

        Example:
        ```python
        classifier = keras_masking.models.TransformerTextClassifier(backbone, num_classes=3)
        classifier.enable_fl_tuning(units=8)
        tuned_again = classifier.merge_fl().unmerge_fl()
        ```
        """
        return self._with_backbone(self.backbone.unmerge_fl(units, placement, layers))

    def save_to_preset(self, preset_dir, max_shard_size=10):
        """keras-hub's ``save_to_preset``, plus a model card (``README.md``) of backbone and head.

        Whole or not at all, as `TransformerBackbone.save_to_preset`.

        Args:
            preset_dir: the preset folder.
            max_shard_size: keras-hub's shard size in GB.

        Example:
        ```python
        classifier = keras_masking.models.TransformerTextClassifier(backbone, num_classes=3)
        classifier.save_to_preset("my_classifier")
        ```
        """
        save = super().save_to_preset
        head = f"sentence (pair) classification into {self.num_classes} classes"

        def write(folder):
            save(folder, max_shard_size=max_shard_size)
            write_model_card(folder, model_card(self.backbone, self.name, head=head))

        replace_folder_atomically(preset_dir, write, keep_other_files=kept_across_preset_saves)

    def merge_lora(self):
        """A new classifier whose backbone has LoRA merged (`TransformerBackbone.merge_lora`).

        Example:
        ```python
        classifier = keras_masking.models.TransformerTextClassifier(backbone, num_classes=3)
        classifier.enable_lora(2)
        merged = classifier.merge_lora()
        ```
        """
        return self._with_backbone(self.backbone.merge_lora())

    def serving_copy(self):
        """The plain inference classifier: the backbone's serving copy, this head and preprocessor.

        DropToken and ASA are off, FL-tuning and LoRA merged; predictions are
        this classifier's (within float rounding of the merged sums).

        Example:
        ```python
        classifier = keras_masking.models.TransformerTextClassifier(backbone, num_classes=3)
        classifier.enable_fl_tuning(units=8)
        plain = classifier.serving_copy()  # a plain classifier of wider FFNs
        ```
        """
        return self._with_backbone(self.backbone.serving_copy())

    def export(self, filepath, format="tf_saved_model", verbose=True, input_signature=None,
               text_pairs=False, **kwargs):  # fmt: skip
        """Exports the serving copy; with a preprocessor, a SavedModel that takes strings.

        With a preprocessor, ``format="tf_saved_model"`` and no
        ``input_signature``, the SavedModel's ``serving_default`` takes a batch
        of strings (two with ``text_pairs=True``) and returns the logits,
        probabilities and predicted class, and loads with TensorFlow and
        tensorflow-text alone (`keras_masking.models.export_text_classifier`).
        Otherwise this is Keras' ``export`` (token-id inputs; ``"onnx"``,
        ``"openvino"``...) of the serving copy; ``"onnx"`` from either
        backend (`keras_masking.models.onnx_export.export_onnx`: on JAX, a
        TensorFlow process writes it from the same weights). Either way the exported
        graph is the plain inference model: no token dropping, no
        adversaries, FL-tuning and LoRA merged (`serving_copy`).

        Args:
            filepath: the folder (or file, for ONNX) to write.
            format: Keras' export formats.
            verbose: bool.
            input_signature: Keras' ``export`` argument (token-id specs).
            text_pairs: bool, whether ``serving_default`` takes two strings.
            **kwargs: Keras' ``export`` arguments.

        Example:
        ```python
        classifier = keras_masking.models.TransformerTextClassifier(backbone, num_classes=3)
        classifier.export("served", verbose=False)  # token ids in (strings with a preprocessor)
        ```
        """
        if format == "tf_saved_model" and input_signature is None and self.preprocessor:
            if kwargs:
                raise ValueError(
                    "A SavedModel that takes strings has no further options. Received: "
                    f"{sorted(kwargs)}."
                )
            return export_text_classifier(self, filepath, text_pairs=text_pairs, verbose=verbose)
        if format == "onnx" and input_signature is None and not kwargs:
            return export_onnx(self.serving_copy(), filepath, verbose=verbose)  # either backend
        if format == "onnx" and keras.config.backend() == "jax":
            raise ValueError(
                "ONNX export with an input_signature or export options runs on the TensorFlow "
                "backend (tf2onnx; Keras' JAX path, jax2onnx, does not convert these models). "
                "Without them, export(path, format='onnx') writes it from JAX too."
            )
        serving = self.serving_copy()
        if keras.config.backend() == "jax" and format == "tf_saved_model":
            input_signature, kwargs = token_id_signature(serving, input_signature, kwargs)
        elif input_signature is None:  # the copy was never called: Keras needs the inputs
            input_signature = token_id_signature(serving)[0]
        with gelu_as_erf() if format == "onnx" else contextlib.nullcontext():
            return keras.Model.export(
                serving, filepath, format=format, verbose=verbose,
                input_signature=input_signature, **kwargs,
            )  # fmt: skip

    def _with_backbone(self, backbone):
        config = self.get_config()
        # The preprocessor as it is: its config alone holds no vocabulary.
        config.update(backbone=backbone, preprocessor=self.preprocessor)
        classifier = type(self).from_config(config)
        classifier.output_dense.set_weights(self.output_dense.get_weights())
        return classifier

    def call(self, inputs, training=None, mask=None):
        if not (training and self.backbone.asa is not None):
            return super().call(inputs, training=training, mask=mask)
        with asa_training_pass():
            clean = super().call(inputs, training=training, mask=mask)
        features = {name: inputs[name] for name in self.backbone.input}
        outputs, masks = self.backbone.adversarial_forward(features, training=training)
        pooled = self.output_dropout(outputs["pooled_output"], training=training)
        return self.asa_training_outputs(
            clean, self.output_dense(pooled), masks, inputs["padding_mask"]
        )

    def check_inputs(self, inputs):
        """The backbone's `check_inputs` on the feature dict (``segment_ids``
        required); see `TransformerBackbone.check_inputs` for when it runs."""
        self.backbone.check_inputs(inputs, required=sorted(self.input), allowed=tuple(self.input))

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        if not _sparse_loss(getattr(self, "loss", None)):
            return loss  # one-hot, multi-hot or regression targets: no class ids to check
        if _own_loss(self.loss) and self._label_rows(y):
            return loss  # rows (one-hot or soft) for a loss of yours: no class ids either
        return nan_for_labels_out_of_range(loss, y, self.num_classes, float_ids=True)

    def _label_rows(self, labels):
        """Whether ``labels`` are rows of ``num_classes`` entries, not class ids."""
        shape = getattr(labels, "shape", None)
        return (
            shape is not None
            and len(shape) == 2
            and shape[-1] == self.num_classes
            and self.num_classes > 1
        )

    def check_labels(self, labels):
        """Class labels must be ints in ``[0, num_classes)`` (checked when
        concrete; a compiled step's loss is NaN for one outside, from
        `tf.data` for example).

        Run by ``fit`` / ``evaluate`` before a step compiles: an out-of-range
        label would reach TensorFlow's loss as an InvalidArgumentError, or a
        0.0 loss on JAX. One-hot labels ``(batch, num_classes)`` pass when the
        compiled loss may take them (a loss of yours, not Keras' sparse
        cross-entropy).
        """
        if getattr(self, "loss", None) is None and not _default_loss_fits(self.activation):
            raise ValueError(
                f"This classifier's outputs go through activation={self.activation!r}, which the "
                "default loss (sparse categorical cross-entropy on logits or softmax) does not "
                "read: compile it with a loss for them, e.g. "
                "compile(loss=keras.losses.BinaryCrossentropy()) on multi-hot labels."
            )
        if labels is None or isinstance(labels, dict):
            return
        values = concrete_value(labels)
        if values is not None and values.dtype.kind in "USO" and values.size:
            raise ValueError(
                f"Expected integer class labels in [0, {self.num_classes}). Received: labels "
                f"of strings such as {str(np.asarray(values).ravel()[0])!r}: map each name to its "
                "class id first."
            )
        if values is None or values.dtype.kind not in "iuf" or not values.size:
            return
        values = np.asarray(values)
        if self._label_rows(values):
            loss = getattr(self, "loss", None)
            if _sparse_loss(loss) and not _own_loss(loss):  # a loss of yours may take them
                raise ValueError(
                    f"Expected class ids for the compiled sparse cross-entropy. Received: "
                    f"one-hot labels of shape {values.shape}: pass labels.argmax(-1), or "
                    "compile with keras.losses.CategoricalCrossentropy(from_logits=True)."
                )
            argmax_accuracy = getattr(self, "_argmax_accuracy", False)
            if argmax_accuracy and not np.allclose(values.sum(-1), 1, atol=1e-4):
                raise ValueError(
                    f"Received label rows of shape {values.shape} that do not sum to 1 "
                    "(multi-hot, or no label) for a loss of your own, whose metric, Keras' "
                    '"accuracy", would read each row by its largest entry. Compile with the '
                    "metrics they need, e.g. metrics=[keras.metrics.BinaryAccuracy(threshold=0.0)] "
                    "on logits, or metrics=[]."
                )
            return  # one-hot, for a loss that takes them
        flat = values.reshape(-1)
        bad = flat[(flat != np.round(flat)) | (flat < 0) | (flat >= self.num_classes)]
        if bad.size:
            raise ValueError(
                f"Expected class labels in [0, {self.num_classes}) for this classifier of "
                f"{self.num_classes} classes. Received: labels with the values "
                f"{sorted(set(bad.tolist()))[:5]}."
            )

    def compile(self, optimizer="auto", loss="auto", *, metrics="auto", **kwargs):
        """keras-hub's `TextClassifier.compile`, whose default loss fits logits or softmax only.

        The default, sparse categorical cross-entropy, reads logits
        (``activation=None``) or softmax probabilities. For another activation
        (``"sigmoid"``: multi-label) it would read probabilities as logits,
        differently on each backend; there is none then, and ``fit`` and
        ``evaluate`` refuse until you pass a loss. ``metrics="auto"`` is the
        accuracy that reads the loss's labels: class ids for a sparse
        cross-entropy, one-hot rows for a categorical one, multi-hot rows
        (at 0.5, or 0 on logits) for a binary one; none for Keras' other
        losses (regression, hinge...); a binary accuracy at 0 for
        `keras_masking.losses.multilabel_categorical_crossentropy`; for a
        loss of your own, Keras' ``"accuracy"``, which reads class ids or
        one-hot rows by their shape (class ids are checked to be in range,
        as for keras-hub's default loss, and concrete multi-hot rows are
        refused: pass their metrics). The loss is read by its function,
        whatever the spelling: a name, a class name, an object or a
        `functools.partial`.

        Args:
            optimizer, loss, metrics, **kwargs: as
                `keras_hub.models.TextClassifier.compile`.

        Example:
        ```python
        multi_label = keras_masking.models.TransformerTextClassifier(
            backbone, num_classes=3, activation="sigmoid"
        )
        multi_label.compile(loss=keras.losses.BinaryCrossentropy())  # multi-hot labels
        ```
        """
        if loss == "auto" and not _default_loss_fits(self.activation):
            loss = None
        if metrics == "auto" and loss != "auto":  # keras-hub's "auto" is a sparse accuracy
            metrics = _accuracy_for(loss)
        # A loss of yours gets Keras' "accuracy": not for multi-hot rows (`check_labels`).
        self._argmax_accuracy = loss != "auto" and metrics == ["accuracy"] and _own_loss(loss)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    def compile_from_config(self, config):
        """Compiles as the saved model was compiled (`keras.saving.load_model`).

        keras-hub's `TextClassifier` overrides `compile`, so Keras' default
        skips this step; here the saved optimizer, loss, metrics and
        ``jit_compile`` come back, and the optimizer is built so that its
        saved variables load: training resumes where it stopped.

        Args:
            config: the dict `get_compile_config` returned when saving.

        Example:
        ```python
        encoder = keras_masking.models.TransformerBackbone(
            vocabulary_size=32, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
            max_sequence_length=8,
        )
        text_classifier = keras_masking.models.TransformerTextClassifier(encoder, num_classes=2)
        text_classifier.compile(optimizer=keras.optimizers.Adam(1e-3))
        text_classifier.save("classifier.keras")
        restored = keras.saving.load_model("classifier.keras")
        assert abs(float(restored.optimizer.learning_rate) - 1e-3) < 1e-9
        ```
        """
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self.optimizer is not None and self.built:
            self.optimizer.build(self.trainable_variables)

    def get_config(self):
        # keras-hub's Task config holds the backbone, the preprocessor and the
        # name (the compute dtype follows the backbone's).
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "activation": keras.activations.serialize(self.activation),
            "dropout": self.dropout,
            "trainable": self.trainable,
        }

    @classmethod
    def from_config(cls, config):
        # keras-hub's Task.from_config writes the deserialized backbone and
        # preprocessor into the dict it is given: keep the caller's as it was.
        return super().from_config(dict(config))

    @classmethod
    def from_preset(cls, preset, load_weights=True, sequence_length=None, **kwargs):
        """keras-hub's `Task.from_preset`, keeping a classifier preset's own head.

        keras-hub builds a fresh head whenever ``num_classes`` is given; here a
        classifier preset's ``num_classes`` keeps its trained head, and another
        builds a fresh one with a warning. From a backbone preset, the
        preprocessor packs ``sequence_length`` tokens (default: 512, or the
        backbone's ``max_sequence_length`` if smaller).

        Args:
            preset: a preset folder (a classifier's or a backbone's).
            load_weights: bool, as keras-hub's.
            sequence_length: None or an int, for a backbone preset's preprocessor.
            **kwargs: ``num_classes`` and the other constructor arguments.

        Example:
        ```python
        classifier = TransformerTextClassifier.from_preset("my_bert_preset", num_classes=2)
        ```
        """
        path = pathlib.Path(os.fspath(preset))
        task_file = path / "task.json"
        task = None
        if task_file.is_file():
            task = read_json_object(task_file, "the task.json that save_to_preset wrote")
        config = {}
        if (path / "config.json").is_file():
            config = read_json_object(path / "config.json", "the preset's config.json")
        config = config.get("config") or {}
        if task is None and "num_classes" not in kwargs and path.is_dir():
            raise ValueError(
                f"{path} holds no task.json (a classifier preset's head), so a head is built "
                "afresh. Expected num_classes=, or the classifier preset's task.json."
            )
        if task is not None and "num_classes" in kwargs:
            saved = task.get("config", {}).get("num_classes")
            if kwargs["num_classes"] == saved:
                del kwargs["num_classes"]  # keras-hub would skip the trained head
            else:
                logger.warning("%s: a fresh head of %s classes; the preset's head of %s classes "
                               "is not loaded.", path, kwargs["num_classes"], saved)  # fmt: skip
        if (
            "preprocessor" not in kwargs
            and not task_file.is_file()
            and not (path / "preprocessor.json").is_file()
            and (path / "tokenizer.json").is_file()
        ):
            length = sequence_length or min(512, config.get("max_sequence_length", 512))
            kwargs["preprocessor"] = cls.preprocessor_cls.from_preset(
                os.fspath(preset), sequence_length=length
            )
        elif sequence_length is not None:
            raise ValueError(
                "sequence_length sets the preprocessor of a preset that has none (a backbone's); "
                f"{path} has its own. Pass preprocessor= to change it."
            )
        if (
            task is not None
            and load_weights
            and "num_classes" not in kwargs
            and issubclass(declared_task_class(task) or object, cls)
            and not (path / "task.weights.h5").is_file()
        ):  # keras-hub would build the head afresh, without a word
            raise ValueError(
                f"{path / 'task.weights.h5'}: not found, so the trained head of {task_file} "
                "cannot be loaded. Expected the file save_to_preset wrote (copy it again), or "
                "pass num_classes= for a fresh head."
            )
        policy = (config.get("dtype") or {}).get("config", {}).get("name")
        if kwargs.get("dtype") is None and str(policy).startswith("mixed_"):
            # keras-hub's task loader refuses a mixed policy's name ("Invalid dtype");
            # a float one it loads under the global policy, as here.
            kwargs["dtype"] = keras.config.dtype_policy()
        # Every file checked as a backbone preset's is (JSON, truncated weights, NaN).
        return read_keras_hub_preset(super(), preset, load_weights=load_weights, **kwargs)


def _check_backbone(backbone):
    if isinstance(backbone, TransformerBackbone):
        return
    hint = ""
    if isinstance(backbone, keras_hub.models.Backbone):
        hint = (
            " Convert a keras-hub BERT/RoBERTa backbone with "
            "keras_masking.models.TransformerBackbone.from_keras_hub(backbone) (same outputs)."
        )
    raise ValueError(
        f"Expected a keras_masking.models.TransformerBackbone for backbone.{hint} "
        f"Received: backbone={type(backbone).__name__}."
    )


def _check_preprocessor(preprocessor, backbone):
    """Refuses a preprocessor whose outputs do not fit the backbone."""
    if preprocessor is None:
        return
    if not isinstance(preprocessor, keras_hub.models.TextClassifierPreprocessor):
        raise ValueError(
            "Expected a TransformerTextClassifierPreprocessor or None for preprocessor. "
            f"Received: preprocessor={preprocessor!r}."
        )
    if backbone.custom_position_ids:
        raise ValueError(
            "This backbone takes a `position_ids` input (custom_position_ids=True), which "
            "the preprocessor does not produce. Pass preprocessor=None and give the model "
            "token_ids, segment_ids, padding_mask and position_ids, or use a backbone with "
            "custom_position_ids=False."
        )
    tokenizer = preprocessor.tokenizer
    # A tokenizer restored from a file gets its vocabulary after the model is
    # built (keras-hub loads assets last); it was checked when it was saved.
    if getattr(tokenizer, "vocabulary", None) is not None:
        size = tokenizer.vocabulary_size()
        if size != backbone.vocabulary_size:
            raise ValueError(
                f"The preprocessor's vocabulary does not fit the backbone: the tokenizer has "
                f"{size} tokens and the backbone's token embedding has vocabulary_size="
                f"{backbone.vocabulary_size} rows. Use the vocabulary the backbone was "
                "trained with (its vocab.txt)."
            )
    length = preprocessor.sequence_length
    if backbone.position == "absolute" and length > backbone.max_sequence_length:
        raise ValueError(
            f"The preprocessor's sequence_length={length} exceeds the backbone's "
            f"max_sequence_length={backbone.max_sequence_length} (its absolute position "
            f"table). Build the preprocessor with sequence_length <= "
            f"{backbone.max_sequence_length}."
        )


def _accuracy_for(loss):
    """The accuracy metrics that read the labels ``loss`` takes ([] for another loss)."""
    name, from_logits = _loss_function(loss)
    if _own_loss(loss):  # Keras' "accuracy" reads class ids or one-hot rows, by their shape
        return ["accuracy"]
    if _sparse_loss(loss):
        return [keras.metrics.SparseCategoricalAccuracy()]
    if name in _ONE_HOT_LOSSES:
        return [keras.metrics.CategoricalAccuracy()]
    if name in _MULTI_HOT_LOSSES:
        return [keras.metrics.BinaryAccuracy(threshold=0.0 if from_logits else 0.5)]
    if name in _SCORE_MULTI_HOT_LOSSES:
        return [keras.metrics.BinaryAccuracy(threshold=0.0)]
    return []


def _default_loss_fits(activation):
    """Whether keras-hub's default loss reads outputs of ``activation`` (logits or softmax)."""
    activation = keras.activations.get(activation)
    return activation in (keras.activations.linear, keras.activations.softmax)
