"""The one-line MLM embedding correction for `model.fit`."""

import math

import keras

from keras_masking.methods.mlm_embedding_correction import DEFAULT_SETTINGS
from keras_masking.methods.mlm_embedding_correction import check_correction_settings
from keras_masking.methods.mlm_embedding_correction import check_mlm_correction
from keras_masking.methods.mlm_embedding_correction import check_random_token_range
from keras_masking.methods.mlm_embedding_correction import correct_mlm_embeddings
from keras_masking.methods.mlm_embedding_correction import masker_vocabulary_size
from keras_masking.methods.mlm_embedding_correction import masking_configuration
from keras_masking.methods.mlm_embedding_correction import stale_average_steps
from keras_masking.utils.arguments import check_choice

WHEN_CHOICES = ("train_begin", "train_end")


def _settings_of_generator(mask_generator, passed):
    """The generator's settings; an argument also passed must agree with them."""
    settings = masking_configuration(mask_generator)
    given = {name: value for name, value in passed.items() if value is not None}
    expected = check_correction_settings(**settings)
    checked = check_correction_settings(**{**settings, **given})
    for name, value in given.items():
        close = name.endswith("_rate") and math.isclose(checked[name], expected[name], abs_tol=1e-7)
        if checked[name] != expected[name] and not close:
            raise ValueError(
                f"{name}={value!r} contradicts the mask generator's "
                f"{name}={settings[name]!r}; leave it out with `mask_generator`."
            )
    return settings


class MLMEmbeddingCorrection(keras.callbacks.Callback):
    """Applies `keras_masking.correct_mlm_embeddings` inside `fit`.

    At the start of fine-tuning (``when="train_begin"``, the default) or at
    the end of MLM pretraining (``when="train_end"``). A model already
    corrected is left as it is, so calling `fit` again does not correct
    twice. Arguments are checked here, and against the model when `fit`
    starts, so a bad setting fails before the first training step.

    Keras runs callbacks in list order, and some write the weights. List
    this one before `keras.callbacks.BackupAndRestore`: a resumed run's
    restored weights are corrected already but carry no record (a weights
    file holds the table only), so a correction after the restore corrects
    twice. With ``when="train_end"``, list it after
    `keras.callbacks.EarlyStopping` with ``restore_best_weights=True``, whose
    restore would otherwise write the uncorrected table back under the
    record. With ``when="train_begin"`` an optimizer with ``use_ema=True``
    that has already stepped is refused: Keras writes its averages of the
    uncorrected table into the weights when `fit` ends.

    Args:
        mask_token_id: int. The [MASK] id; optional with ``mask_generator``.
        mask_generator: optional keras-hub `MaskedLMMaskGenerator` or
            masked-LM preprocessor to read the configuration from (then the
            masking arguments must be left out, or agree with it).
        when: ``"train_begin"`` or ``"train_end"``.
        embedding: see `correct_mlm_embeddings`.
        **settings: the other arguments of `correct_mlm_embeddings`
            (``mask_rate``, ``mask_token_rate``, ``random_token_rate``,
            ``unselectable_token_ids``, ``tied_output``), with its defaults.

    Attributes:
        record: the `MLMEmbeddingCorrectionRecord` applied by this callback,
            or None.

    Example:
    ```python
    classifier.fit(
        train_data,
        callbacks=[keras_masking.callbacks.MLMEmbeddingCorrection(mask_token_id=103)],
    )
    ```
    """

    def __init__(
        self,
        mask_token_id=None,
        *,
        mask_generator=None,
        when="train_begin",
        embedding=None,
        **settings,
    ):
        super().__init__()
        self.when = check_choice("when", when, WHEN_CHOICES)
        if embedding is not None and not isinstance(embedding, (str, keras.layers.Embedding)):
            raise TypeError(
                "Expected a keras.layers.Embedding, a layer name or None for embedding. "
                f"Received: embedding={embedding!r}."
            )
        tied_output = settings.pop("tied_output", DEFAULT_SETTINGS["tied_output"])
        self.masker_vocabulary_size = None
        if mask_generator is not None:
            self.masker_vocabulary_size = masker_vocabulary_size(mask_generator)
            passed = {"mask_token_id": mask_token_id, **settings}
            settings = _settings_of_generator(mask_generator, passed)
            mask_token_id = settings.pop("mask_token_id")
        elif mask_token_id is None:
            raise ValueError(
                "Expected a mask_token_id (or a mask_generator). Received: mask_token_id=None."
            )
        # Validate now, not at the end of a long training run.
        self.settings = check_correction_settings(
            mask_token_id, **settings, tied_output=tied_output
        )
        self.embedding = embedding
        self.record = None

    def _arguments(self):
        return dict(**self.settings, embedding=self.embedding)

    def on_train_begin(self, logs=None):
        # Both paths check the ids, the embedding, the table and tied heads
        # against the model before the first step.
        check_random_token_range(self.model, self.masker_vocabulary_size, self.embedding)
        if self.when == "train_end":
            check_mlm_correction(self.model, **self._arguments())
            return
        steps = stale_average_steps(self.model)
        if steps and check_mlm_correction(self.model, **self._arguments()):
            raise ValueError(
                "Expected an optimizer that keeps no moving averages of the weights, or one that "
                "has not stepped yet, for a correction when fit begins: Keras writes the averages "
                "of the uncorrected table into the weights at the end of fit. Received: "
                f"use_ema=True after {steps} steps. Compile with a fresh optimizer, or correct "
                "with when='train_end'."
            )
        self.record = correct_mlm_embeddings(self.model, **self._arguments()) or self.record

    def on_train_end(self, logs=None):
        if self.when == "train_end":
            self.record = correct_mlm_embeddings(self.model, **self._arguments()) or self.record
