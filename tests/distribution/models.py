"""The tiny models of every method, for the distribution and mixed-precision tests.

`build(method, dropout)` returns a compiled model of one method (or of a few
methods composed), its inputs, labels, sample weights and callbacks. No
side effects at import: the device setup belongs to the process that imports
it (tests/distribution/distributed_steps.py sets up simulated devices first).
"""

import keras
import numpy as np

import keras_masking
from tests.testing import tiny_backbone_kwargs

CLS, SEP, MASK = 1, 2, 3
VOCABULARY = tiny_backbone_kwargs()["vocabulary_size"]
LENGTH = 12
BATCH = 4


def features(seed=0, rotary2d=False):
    """A global batch of 4: the first replica's rows padded, the second's full,
    so that a mean of the replicas' means would differ from the global mean."""
    rng = np.random.default_rng(seed)
    token_ids = rng.integers(4, VOCABULARY, (BATCH, LENGTH)).astype("int32")
    padding_mask = np.ones((BATCH, LENGTH), "int32")
    for row, real in enumerate((6, 9, LENGTH, LENGTH)):
        token_ids[row, 0], token_ids[row, real - 1] = CLS, SEP
        token_ids[row, real:] = 0
        padding_mask[row, real:] = 0
    x = {"token_ids": token_ids, "padding_mask": padding_mask}
    if not rotary2d:
        x["segment_ids"] = np.zeros_like(token_ids)
    return x


def backbone(dropout, **overrides):
    """The tests' tiny backbone (`tiny_backbone_kwargs`) with one layer: every
    method is checked once per layer, and a second one doubles the compile."""
    kwargs = tiny_backbone_kwargs(**{"num_layers": 1, "dropout": dropout, **overrides})
    return keras_masking.models.TransformerBackbone(**kwargs)


def classifier(encoder):
    logits = keras.layers.Dense(3, name="head")(encoder(encoder.input)["pooled_output"])
    return keras.Model(encoder.input, logits)


_OPTIMIZER = []


def _compile(model, **kwargs):
    model.compile(
        optimizer=_OPTIMIZER[0]() if _OPTIMIZER else keras.optimizers.SGD(0.1),
        jit_compile=keras.config.backend() == "jax",  # tf.distribute steps: no XLA
        **kwargs,
    )
    return model


def compile_classifier(model):
    return _compile(model, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


LABELS = np.array([0, 1, 2, 1])


def build(method, dropout, optimizer=None):
    """``(model, x, y, sample_weight, callbacks)`` for one method.

    ``optimizer``: a function making the optimizer (default ``SGD(0.1)``).
    """
    _OPTIMIZER[:] = [optimizer] if optimizer is not None else []
    x, y, weights, callbacks = features(), LABELS, None, []
    if method == "plain":
        model = compile_classifier(classifier(backbone(dropout)))
    elif method in ("drop_token", "drop_token+embedding_correction"):
        encoder = backbone(dropout)
        encoder.enable_drop_token(0.3, unselectable_token_ids=(CLS, SEP), seed=3)
        model = compile_classifier(classifier(encoder))
        if method.endswith("embedding_correction"):
            callbacks = [keras_masking.callbacks.MLMEmbeddingCorrection(mask_token_id=MASK)]
    elif method == "asa+drop_token+fl_tuning":  # ASA on a DropToken encoder, FL-tuned
        encoder = backbone(dropout)
        encoder.enable_drop_token(0.3, unselectable_token_ids=(CLS, SEP), mode="attention", seed=3)
        encoder.enable_fl_tuning(units=4)
        encoder.enable_asa(tau=0.5, noise=True, seed=5)
        model = compile_classifier(keras_masking.methods.ASATrainer(classifier(encoder)))
        callbacks = [keras_masking.callbacks.MLMEmbeddingCorrection(mask_token_id=MASK)]
    elif method == "asa":
        encoder = backbone(dropout)
        encoder.enable_asa(tau=0.5, noise=True, seed=5)
        model = compile_classifier(keras_masking.methods.ASATrainer(classifier(encoder)))
    elif method == "asa_regression":  # the divergence's softmax runs over the global batch
        encoder = backbone(dropout)
        encoder.enable_asa(tau=0.5)
        head = keras.layers.Dense(1, name="head")(encoder(encoder.input)["pooled_output"])
        model = keras_masking.methods.ASATrainer(keras.Model(encoder.input, head))
        _compile(model, loss="mse")
        y = np.array([[0.5], [-1.0], [2.0], [0.3]], "float32")
    elif method == "asa_tokens":  # the divergence sums over positions / B
        encoder = backbone(dropout)
        encoder.enable_asa(tau=0.5)
        head = keras.layers.Dense(3, name="head")(encoder(encoder.input)["sequence_output"])
        model = keras_masking.methods.ASATrainer(keras.Model(encoder.input, head))
        _compile(model, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        y = (np.arange(BATCH * LENGTH).reshape(BATCH, LENGTH) % 3).astype("int32")
    elif method == "fl_tuning":
        encoder = backbone(dropout)
        encoder.enable_fl_tuning(units=4)
        model = compile_classifier(classifier(encoder))
    elif method == "prefix_tuning":
        encoder = backbone(dropout)
        encoder.enable_prefix_tuning(length=3, dropout=dropout)
        model = compile_classifier(classifier(encoder))
    elif method == "lora":
        encoder = backbone(dropout)
        encoder.enable_lora(2)
        model = compile_classifier(classifier(encoder))
    elif method == "peft":  # FL-tuning, P-tuning v2 prefixes and LoRA at once
        encoder = backbone(dropout)
        encoder.enable_lora(2)
        encoder.enable_fl_tuning(units=4)
        encoder.enable_prefix_tuning(length=3, dropout=dropout)
        model = compile_classifier(classifier(encoder))
    elif method == "embedding_correction":
        model = compile_classifier(classifier(backbone(dropout)))
        callbacks = [keras_masking.callbacks.MLMEmbeddingCorrection(mask_token_id=MASK)]
    elif method == "masked_lm":
        model = keras_masking.models.TransformerMaskedLM(backbone(dropout))
        _compile(
            model,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=["sparse_categorical_accuracy"],
        )
        x = dict(x, mask_positions=np.array([[1, 2, 0], [3, 5, 7], [2, 4, 9], [1, 6, 10]], "int32"))
        y = np.take_along_axis(x["token_ids"], x["mask_positions"], axis=1)
        weights = np.array([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]], "float32")
    elif method in ("exlm", "exlm_mlm"):
        encoder = backbone(dropout, position="rotary2d", custom_position_ids=True, num_segments=0)
        model = keras_masking.models.ExLMPretrainer(
            encoder,
            k=2,
            mask_token_id=MASK,
            unselectable_token_ids=(CLS, SEP),
            objective="exlm" if method == "exlm" else "mlm",
            replacement="mask" if method == "exlm" else "bert",
            mask_rate=0.2,
            transition_heads=2,
            seed=7,
        )
        x, y = features(rotary2d=True), None
        _compile(model)
    else:
        raise ValueError(f"Unknown method {method!r}.")
    return model, x, y, weights, callbacks


def fit_one_step(method, dropout=0.0, optimizer=None):
    """Builds the method's model (seed 0, `randomize`d weights) and takes one
    `fit` step on its global batch: ``(model, weights before, weights after,
    the last logs)``. Build it under the scope or dtype policy to test."""
    keras.utils.set_random_seed(0)
    model, x, y, weights, callbacks = build(method, dropout, optimizer=optimizer)
    randomize(model)
    # Your own compiled model on TensorFlow: built before the step is traced, once.
    keras_masking.utils.build_optimizer(model, x, y)
    before = [np.array(v.numpy()) for v in model.trainable_variables]
    history = model.fit(
        x,
        y,
        sample_weight=weights,
        batch_size=BATCH,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    ).history
    after = [np.array(v.numpy()) for v in model.trainable_variables]
    return model, before, after, {name: float(values[-1]) for name, values in history.items()}


def randomize(model, scale=0.3):
    """Large random weights (the same in every run), so that every term shows:
    kernels and tables N(0, scale), LayerNorm scales near 1, offsets N(0, 0.1)."""
    rng = np.random.default_rng(1)
    for variable in model.weights:
        if "float" not in str(variable.dtype):
            continue
        shape = variable.shape
        if variable.path.endswith("gamma"):
            value = 1.0 + rng.normal(0.0, 0.1, shape)
        elif variable.path.endswith(("beta", "bias")):
            value = rng.normal(0.0, 0.1, shape)
        else:
            value = rng.normal(0.0, scale, shape)
        variable.assign(value.astype("float32"))


#: The default run: every method at least once, composed where they compose,
#: and ASA's regression (its divergence's softmax couples the batch's rows).
METHODS = (
    "drop_token",
    "asa+drop_token+fl_tuning",
    "asa_regression",
    "peft",
    "masked_lm",
    "exlm",
)
#: Each method alone, and ExLMPretrainer's MLM objective (the slow test).
ALL_METHODS = (
    "plain",
    "drop_token",
    "embedding_correction",
    "drop_token+embedding_correction",
    "asa",
    "asa+drop_token+fl_tuning",
    "asa_regression",
    "asa_tokens",
    "fl_tuning",
    "prefix_tuning",
    "lora",
    "peft",
    "masked_lm",
    "exlm",
    "exlm_mlm",
)
