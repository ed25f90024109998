"""The one-line MLM embedding correction for `model.fit`."""

import keras

from keras_masking.methods.mlm_embedding_correction import correct_mlm_embeddings
from keras_masking.methods.mlm_embedding_correction import masking_configuration

WHEN_CHOICES = ("train_begin", "train_end")


class MLMEmbeddingCorrection(keras.callbacks.Callback):
    """Applies `keras_masking.correct_mlm_embeddings` inside `fit`.

    At the start of fine-tuning (``when="train_begin"``, the default) or at
    the end of MLM pretraining (``when="train_end"``). Idempotent: a model
    that was already corrected (the record is kept in a `TransformerBackbone`'s
    config) is left as it is, so calling `fit` again does not correct twice.

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
        if when not in WHEN_CHOICES:
            raise ValueError(f"`when` must be one of {WHEN_CHOICES}. Received: when={when!r}")
        if mask_generator is not None:
            settings = masking_configuration(mask_generator)
            if mask_token_id not in (None, settings["mask_token_id"]):
                raise ValueError(
                    f"mask_token_id={mask_token_id} contradicts the mask generator's "
                    f"{settings['mask_token_id']}."
                )
        elif mask_token_id is None:
            raise ValueError("Pass `mask_token_id` (or a `mask_generator`).")
        else:
            settings = {
                "mask_token_id": mask_token_id,
                "mask_rate": mask_rate,
                "mask_token_rate": mask_token_rate,
                "random_token_rate": random_token_rate,
                "unselectable_token_ids": unselectable_token_ids,
            }
        # Validate now, not at the end of a long training run.
        from keras_masking.ops.embedding_correction import validate_masking_rates

        validate_masking_rates(
            settings["mask_rate"], settings["mask_token_rate"], settings["random_token_rate"]
        )
        self.settings = settings
        self.tied_output = tied_output
        self.embedding = embedding
        self.when = when
        self.record = None

    def _apply(self):
        record = correct_mlm_embeddings(
            self.model, **self.settings, tied_output=self.tied_output, embedding=self.embedding
        )
        if record is not None:
            self.record = record

    def on_train_begin(self, logs=None):
        if self.when == "train_begin":
            self._apply()

    def on_train_end(self, logs=None):
        if self.when == "train_end":
            self._apply()
