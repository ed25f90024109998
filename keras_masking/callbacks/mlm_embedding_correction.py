"""The one-line MLM embedding correction for `model.fit`."""

import math

import keras

from keras_masking.methods.mlm_embedding_correction import check_correction_settings
from keras_masking.methods.mlm_embedding_correction import check_mlm_correction
from keras_masking.methods.mlm_embedding_correction import correct_mlm_embeddings
from keras_masking.methods.mlm_embedding_correction import masking_configuration
from keras_masking.ops.embedding_correction import check_rate
from keras_masking.ops.embedding_correction import check_token_id
from keras_masking.ops.embedding_correction import check_token_ids

WHEN_CHOICES = ("train_begin", "train_end")
_RATE_DEFAULTS = {"mask_rate": 0.15, "mask_token_rate": 0.8, "random_token_rate": 0.1}


def _agrees(name, value, generator_value):
    """Whether an argument passed with a mask generator is left out or agrees."""
    if value is None:
        return True
    if name == "unselectable_token_ids":
        ids = check_token_ids(name, value)
        return generator_value is not None and ids == sorted(set(generator_value))
    if name in _RATE_DEFAULTS:
        rate = check_rate(name, value)
        return rate == _RATE_DEFAULTS[name] or math.isclose(rate, generator_value, abs_tol=1e-7)
    return check_token_id(name, value) == generator_value


class MLMEmbeddingCorrection(keras.callbacks.Callback):
    """Applies `keras_masking.correct_mlm_embeddings` inside `fit`.

    At the start of fine-tuning (``when="train_begin"``, the default) or at
    the end of MLM pretraining (``when="train_end"``). Idempotent: a model
    that was already corrected (the record is kept in a `TransformerBackbone`'s
    config) is left as it is, so calling `fit` again does not correct twice.

    The token embedding is found in any model that holds a
    `TransformerBackbone` or a keras-hub backbone (`BertBackbone`,
    `RobertaBackbone`, ...), nested or inlined through ``backbone.output``.
    Arguments are checked here, and against the model when `fit` starts
    (also with ``when="train_end"``), so a bad setting fails before the
    first training step.

    Args:
        mask_token_id: int. The [MASK] id; optional with ``mask_generator``.
        mask_rate, mask_token_rate, random_token_rate,
        unselectable_token_ids, tied_output, embedding: see
            `correct_mlm_embeddings`.
        mask_generator: optional keras-hub `MaskedLMMaskGenerator` or
            masked-LM preprocessor to read the configuration from (then the
            rate arguments must be left out).
        when: ``"train_begin"`` or ``"train_end"``.

    Attributes:
        record: the `MLMEmbeddingCorrection` applied by this callback, or None.

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
        mask_rate=0.15,
        mask_token_rate=0.8,
        random_token_rate=0.1,
        unselectable_token_ids=None,
        tied_output="keep",
        embedding=None,
        mask_generator=None,
        when="train_begin",
    ):
        super().__init__()
        if not isinstance(when, str) or when not in WHEN_CHOICES:
            raise ValueError(f"`when` must be one of {WHEN_CHOICES}. Received: when={when!r}")
        if embedding is not None and not isinstance(embedding, (str, keras.layers.Embedding)):
            raise TypeError(
                "`embedding` must be a keras.layers.Embedding, a layer name or None. "
                f"Received: embedding={embedding!r}"
            )
        passed = {
            "mask_token_id": mask_token_id,
            "mask_rate": mask_rate,
            "mask_token_rate": mask_token_rate,
            "random_token_rate": random_token_rate,
            "unselectable_token_ids": unselectable_token_ids,
        }
        if mask_generator is not None:
            settings = masking_configuration(mask_generator)
            for name, value in passed.items():
                if not _agrees(name, value, settings[name]):
                    raise ValueError(
                        f"{name}={value!r} contradicts the mask generator's "
                        f"{name}={settings[name]!r}; leave it out with `mask_generator`."
                    )
        elif mask_token_id is None:
            raise ValueError(
                "Pass `mask_token_id` (or a `mask_generator`). Received: mask_token_id=None"
            )
        else:
            settings = passed
        # Validate now, not at the end of a long training run.
        settings = check_correction_settings(**settings, tied_output=tied_output)
        self.tied_output = settings.pop("tied_output")
        self.settings = settings
        self.embedding = embedding
        self.when = when
        self.record = None

    def _arguments(self):
        return dict(**self.settings, tied_output=self.tied_output, embedding=self.embedding)

    def _apply(self):
        record = correct_mlm_embeddings(self.model, **self._arguments())
        if record is not None:
            self.record = record

    def on_train_begin(self, logs=None):
        # Both paths check the ids, the embedding, the table and tied heads
        # against the model before the first step (`_apply` checks all
        # before it changes anything).
        if self.when == "train_begin":
            self._apply()
        else:
            check_mlm_correction(self.model, **self._arguments())

    def on_train_end(self, logs=None):
        if self.when == "train_end":
            self._apply()
