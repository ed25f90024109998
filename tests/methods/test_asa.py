"""ASA: the gradient reversal, the adversary, the replacing mask, the
divergences and the trainer, checked against independent computations."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_masking
from keras_masking.layers import AttentionAdversary
from keras_masking.layers import GradientReversal
from keras_masking.layers import SelfAttention
from keras_masking.losses import asa_divergence
from keras_masking.models import TransformerBackbone
from keras_masking.ops import apply_replacing_mask
from keras_masking.ops import reverse_gradient
from keras_masking.ops import straight_through_step
from tests.testing import model_gradients
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs
from tests.testing import value_and_gradients

TAU = 0.5
CE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))


# === Gradient reversal and the straight-through step ===
@pytest.mark.parametrize("alpha", [1.0, 0.3, 2.5])
def test_gradient_reversal_is_identity_forward_and_minus_alpha_backward(alpha):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5)).astype("float32") * 1e3
    upstream = rng.normal(size=(3, 5)).astype("float32")
    layer = GradientReversal(alpha=alpha)
    np.testing.assert_array_equal(np.asarray(layer(x)), x)  # bit for bit
    _, (grad,) = value_and_gradients(lambda v: ops.sum(reverse_gradient(v, alpha) * upstream), [x])
    np.testing.assert_allclose(grad, -alpha * upstream, rtol=1e-6)
    restored = GradientReversal.from_config(layer.get_config())
    assert restored.alpha == alpha
    with pytest.raises(ValueError, match=r"Expected alpha in \[0.0, inf\)"):
        GradientReversal(alpha=-1.0)
    with pytest.raises(ValueError, match="Expected a finite number for alpha"):
        GradientReversal(alpha=float("inf"))


def test_straight_through_step_is_binary_with_the_sigmoid_gradient():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(4, 6)).astype("float32") * 3
    upstream = rng.normal(size=(4, 6)).astype("float32")
    forward = np.asarray(straight_through_step(scores))
    np.testing.assert_array_equal(forward, (scores > 0).astype("float32"))
    _, (grad,) = value_and_gradients(
        lambda s: ops.sum(straight_through_step(s) * upstream), [scores]
    )
    s = _sigmoid(scores)
    np.testing.assert_allclose(grad, s * (1 - s) * upstream, rtol=1e-5, atol=1e-7)
    # Noise moves the threshold, not the gradient.
    noise = rng.normal(size=(4, 6)).astype("float32") * 3
    noisy = np.asarray(straight_through_step(scores, threshold_noise=noise))
    np.testing.assert_array_equal(noisy, (scores + noise > 0).astype("float32"))


# === The adversary ===
def _adversary_scores(adversary, hidden, padding_mask):
    w = {v.path.split("/", 1)[1]: np.asarray(v) for v in adversary.weights}
    q = hidden @ w["query/kernel"] + w["query/bias"]
    k = hidden @ w["key/kernel"] + w["key/bias"]
    scores = np.einsum("bqd,bkd->bqk", q, k) / np.sqrt(hidden.shape[-1])
    return scores + ((1 - padding_mask) * -10000.0)[:, None, :]


def test_adversary_is_the_official_formula_and_reverses_its_gradient():
    rng = np.random.default_rng(2)
    hidden = rng.normal(size=(2, 5, 8)).astype("float32")
    padding_mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], "float32")
    adversary = AttentionAdversary(name="adversary")
    adversary.build((None, None, 8))
    randomize_weights(adversary, seed=3, scale=0.5)
    mask = np.asarray(adversary(hidden, padding_mask))
    scores = _adversary_scores(adversary, hidden, padding_mask)
    assert mask.dtype == np.float32 and set(np.unique(mask)) <= {0.0, 1.0}
    np.testing.assert_array_equal(mask, (scores > 0).astype("float32"))
    assert mask[1, :, 3:].max() == 0  # padded keys masked
    assert mask[1, 3:, :3].sum() > 0  # padded query rows are computed
    np.testing.assert_array_equal(
        np.asarray(AttentionAdversary.mask_bias(mask)), ((1 - mask) * -10000.0)[:, None]
    )
    # d/dphi sum(M * U) = -(VJP of S with sigmoid'(S) * U); no gradient to H.
    upstream = rng.normal(size=mask.shape).astype("float32")
    order = ["query/kernel", "query/bias", "key/kernel", "key/bias"]
    by_name = {v.path.split("/", 1)[1]: np.asarray(v) for v in adversary.weights}
    s = _sigmoid(scores)

    def scores_of(wq, bq, wk, bk):
        q = ops.matmul(hidden, wq) + bq
        k = ops.matmul(hidden, wk) + bk
        return ops.einsum("bqd,bkd->bqk", q, k) / np.sqrt(8.0)

    _, expected = value_and_gradients(
        lambda *w: ops.sum(scores_of(*w) * (s * (1 - s) * upstream)),
        [by_name[name] for name in order],
    )
    _, actual = _layer_gradients(adversary, hidden, padding_mask, upstream, order)
    for name, want, got in zip(order, expected, actual):
        np.testing.assert_allclose(got, -want, rtol=1e-4, atol=1e-6, err_msg=name)
    _, (hidden_grad,) = value_and_gradients(
        lambda h: ops.sum(adversary(h, padding_mask) * upstream), [hidden]
    )
    assert not hidden_grad.any()


def _layer_gradients(adversary, hidden, padding_mask, upstream, order):
    """Gradients of ``sum(adversary(hidden) * upstream)`` wrt its weights."""
    by_name = {v.path.split("/", 1)[1]: v for v in adversary.trainable_variables}
    variables = [by_name[name] for name in order]
    values = [np.asarray(v) for v in variables]

    def fn(*weights):
        mapping = list(zip(variables, weights))
        with keras.StatelessScope(state_mapping=mapping):
            return ops.sum(adversary(hidden, padding_mask) * upstream)

    return value_and_gradients(fn, values)


def test_adversary_init_config_and_mixed_precision():
    adversary = AttentionAdversary(name="adversary")
    adversary.build((None, None, 256))
    kernel = np.asarray(adversary.query.kernel)
    assert abs(kernel.std() - 0.02) < 0.001 and abs(kernel.mean()) < 0.001
    assert not np.asarray(adversary.query.bias).any()
    assert AttentionAdversary.from_config(adversary.get_config()).get_config() == (
        adversary.get_config()
    )
    with pytest.raises(ValueError, match="alpha"):
        AttentionAdversary(alpha=-0.5)
    with pytest.raises(ValueError, match="Expected a finite number for alpha"):
        AttentionAdversary(alpha=float("inf"))
    with pytest.raises(ValueError, match="Expected a finite number for initializer_range"):
        AttentionAdversary(initializer_range=float("inf"))
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        mixed = AttentionAdversary(name="adversary")
        hidden = ops.cast(np.random.default_rng(4).normal(size=(1, 4, 8)), "bfloat16")
        mask = mixed(hidden, np.ones((1, 4)))
        assert keras.backend.standardize_dtype(mask.dtype) == "float32"
        assert mixed.query.kernel.dtype == "float32"
        bias = AttentionAdversary.mask_bias(np.zeros((1, 4, 4)))
        assert (
            keras.backend.standardize_dtype(bias.dtype) == "float32"
            and float(np.asarray(bias).min()) == -10000.0
        )
        logits = ops.cast(np.ones((1, 2, 4, 4)), "bfloat16")
        replaced = np.asarray(apply_replacing_mask(logits, bias))
        assert replaced.dtype == np.float32 and (replaced == -10000.0).all()
    finally:
        keras.config.set_dtype_policy(previous)


# === The replacing mask ===
def test_replacing_mask_semantics_on_a_fully_masked_row():
    scores = np.array([[[[1.0, 4.0, -2.0, 3.0], [0.5, 2.0, 7.0, -1.0]]]], "float32")
    keep = np.array([[[1, 0, 1, 0], [0, 0, 0, 0]]], "float32")  # row 2 fully masked
    padding = np.array([[1, 1, 1, 0]], "float32")
    bias = ((1 - keep) * -10000.0)[:, None]
    replaced = np.asarray(apply_replacing_mask(scores, bias, padding, "replace"))
    np.testing.assert_array_equal(replaced[0, 0, 0], [1.0, -10000.0, -2.0, -10000.0])
    np.testing.assert_array_equal(replaced[0, 0, 1], [-10000.0] * 4)
    additive = np.asarray(apply_replacing_mask(scores, bias, padding, "additive"))
    np.testing.assert_allclose(additive, scores + bias)

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    # bert.py: uniform over every key, padding included.
    np.testing.assert_allclose(softmax(replaced)[0, 0, 1], [0.25] * 4)
    # roberta.py: the raw scores' softmax over every key.
    np.testing.assert_allclose(softmax(additive)[0, 0, 1], softmax(scores)[0, 0, 1], rtol=1e-5)
    # guarded: uniform over the real keys.
    guarded = np.asarray(apply_replacing_mask(scores, bias, padding, "guarded"))
    np.testing.assert_allclose(softmax(guarded)[0, 0, 1], [1 / 3, 1 / 3, 1 / 3, 0], atol=1e-7)
    np.testing.assert_allclose(softmax(guarded)[0, 0, 0], softmax(replaced)[0, 0, 0])
    with pytest.raises(ValueError, match="mask_semantics"):
        apply_replacing_mask(scores, bias, padding, "replace_all")


def test_attention_with_a_replacing_mask_matches_the_formula():
    rng = np.random.default_rng(5)
    hidden = rng.normal(size=(2, 5, 8)).astype("float32")
    padding = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], "float32")
    keep = (rng.uniform(size=(2, 5, 5)) > 0.4).astype("float32")
    keep[0, 2] = 0  # a fully masked row
    layer = SelfAttention(num_heads=2, head_dim=4)
    layer(hidden)
    randomize_weights(layer, seed=6)
    w = {v.path.split("/", 1)[1]: np.asarray(v) for v in layer.weights}
    q, k, v = (
        (hidden @ w[f"{n}/kernel"] + w[f"{n}/bias"]).reshape(2, 5, 2, 4)
        for n in ("query", "key", "value")
    )
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / 2.0
    bias = ((1 - keep) * -10000.0)[:, None]
    expected_logits = logits * (bias >= 0) + bias
    p = np.exp(expected_logits - expected_logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    context = np.einsum("bhqk,bkhd->bqhd", p, v).reshape(2, 5, 8)
    expected = context @ w["attention_output/kernel"] + w["attention_output/bias"]
    actual = layer(hidden, padding_mask=padding, attention_mask_bias=bias)
    np.testing.assert_allclose(actual, expected, atol=1e-5)


def test_encode_mask_hook_sees_each_layers_input_and_costs_nothing_unused(features):
    backbone = TransformerBackbone(**tiny_backbone_kwargs("rotary"))
    randomize_weights(backbone, seed=7)
    hidden = backbone.embed(features["token_ids"], features["segment_ids"])
    seen = []

    padding_bias = ((1 - features["padding_mask"]) * -10000.0)[:, None, None, :]

    def keep_real_keys(index, entering):
        seen.append((index, np.asarray(entering)))
        return padding_bias

    hooked = backbone.encode(hidden, features["padding_mask"], attention_mask_fn=keep_real_keys)
    plain = backbone.encode(hidden, features["padding_mask"])
    np.testing.assert_allclose(hooked, plain, atol=1e-5)  # the same mask, replaced
    expected = np.asarray(hidden)
    for index, entering in seen:
        np.testing.assert_allclose(entering, expected, atol=1e-5)
        expected = np.asarray(
            backbone.transformer_layers[index](expected, padding_mask=features["padding_mask"])
        )
    assert [index for index, _ in seen] == [0, 1]


# === Divergences against PyTorch's KLDivLoss(batchmean), written out ===
def _kl_batchmean(log_input, target):
    return np.sum(target * (np.log(target) - log_input)) / log_input.shape[0]


def _official_divergence(query, target):
    if query.ndim <= 2 and query.shape[1] == 1:
        query, target = query.reshape(-1), target.reshape(-1)

    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    q2t = _kl_batchmean(log_softmax(query), np.exp(log_softmax(target)))
    t2q = _kl_batchmean(log_softmax(target), np.exp(log_softmax(query)))
    return 0.5 * (q2t + t2q)


@pytest.mark.parametrize(
    "task, shape",
    [
        ("classification", (4, 3)),
        ("multiple_choice", (4, 5)),
        ("token_classification", (4, 7, 3)),
        ("regression", (4, 1)),
    ],
)
def test_divergence_equals_the_official_definition(task, shape):
    rng = np.random.default_rng(8)
    clean = rng.normal(size=shape).astype("float64") * 2
    adversarial = rng.normal(size=shape).astype("float64") * 2
    actual = float(asa_divergence(clean.astype("float32"), adversarial.astype("float32"), task))
    np.testing.assert_allclose(actual, _official_divergence(clean, adversarial), rtol=1e-5)
    if task == "token_classification":
        # The official normaliser is the batch: the positions are summed.
        per_position = np.mean(
            [_official_divergence(clean[:, t], adversarial[:, t]) for t in range(shape[1])]
        )
        np.testing.assert_allclose(actual, per_position * shape[1], rtol=1e-5)
        weights = np.ones(shape[:2], "float32")
        weights[:, 5:] = 0
        real_only = float(asa_divergence(clean, adversarial, task, weights=weights))
        expected = _official_divergence(clean[:, :5], adversarial[:, :5])
        np.testing.assert_allclose(real_only, expected, rtol=1e-5)


# === The trainer ===
def _classifier(backbone, classes=3, dropout=0.0):
    pooled = backbone(backbone.input)["pooled_output"]
    logits = keras.layers.Dense(classes, name="head")(keras.layers.Dropout(dropout)(pooled))
    return keras.Model(backbone.input, logits)


def _large_kernels(model, seed):
    """Kernels and embeddings N(0, 0.25), LayerNorms left at 1 / 0: the
    adversarial pass differs clearly from the clean one, and no attention
    softmax saturates (which would zero the divergence's gradient)."""
    rng = np.random.default_rng(seed)
    for variable in model.trainable_weights:
        if variable.path.endswith(("kernel", "embeddings")):
            variable.assign(rng.normal(0, 0.25, variable.shape))


def _snapshot(model):
    return {v.path: np.asarray(v).copy() for v in model.trainable_variables}


def _layer_norm(x, gamma, beta):
    mean = ops.mean(x, axis=-1, keepdims=True)
    variance = ops.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / ops.sqrt(variance + 1e-12) * gamma + beta


class _ReferenceBert:
    """A plain-formula tiny BERT + linear head over a dict of weights."""

    def __init__(self, weights, features, heads):
        self.w = weights
        self.x = features
        self.heads = heads
        self.padding = np.asarray(features["padding_mask"], "float32")

    def embed(self, w):
        x = self.x
        length = x["token_ids"].shape[1]
        hidden = (
            ops.take(w["embeddings/token_embedding/embeddings"], x["token_ids"], axis=0)
            + ops.take(w["embeddings/segment_embedding/embeddings"], x["segment_ids"], axis=0)
            + w["embeddings/position_embedding/embeddings"][:length]
        )
        return _layer_norm(
            hidden, w["embeddings/layer_norm/gamma"], w["embeddings/layer_norm/beta"]
        )

    def layer(self, w, index, hidden, keep=None, keep_constant=None):
        p = f"transformer_layer_{index}/"
        batch, length, width = hidden.shape
        size = width // self.heads

        def project(name):
            out = ops.matmul(hidden, w[p + f"self_attention/{name}/kernel"])
            out = out + w[p + f"self_attention/{name}/bias"]
            return ops.reshape(out, (batch, length, self.heads, size))

        q, k, v = project("query"), project("key"), project("value")
        logits = ops.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(size)
        if keep is None:
            logits = logits + ((1 - self.padding) * -1e9)[:, None, None, :]
        else:  # bert.py: scores * 1[A >= 0] + A, A = (1 - M) * -10000
            bias = ((1 - keep) * -10000.0)[:, None]
            logits = logits * keep_constant[:, None] + bias
        probabilities = ops.softmax(logits, axis=-1)
        context = ops.reshape(
            ops.einsum("bhqk,bkhd->bqhd", probabilities, v), (batch, length, width)
        )
        attended = ops.matmul(context, w[p + "self_attention/attention_output/kernel"])
        attended = attended + w[p + "self_attention/attention_output/bias"]
        hidden = _layer_norm(
            hidden + attended,
            w[p + "attention_layer_norm/gamma"],
            w[p + "attention_layer_norm/beta"],
        )
        inner = ops.gelu(
            ops.matmul(hidden, w[p + "feed_forward/intermediate_dense/kernel"])
            + w[p + "feed_forward/intermediate_dense/bias"],
            approximate=False,
        )
        out = ops.matmul(inner, w[p + "feed_forward/output_dense/kernel"])
        out = out + w[p + "feed_forward/output_dense/bias"]
        return _layer_norm(
            hidden + out,
            w[p + "feed_forward_layer_norm/gamma"],
            w[p + "feed_forward_layer_norm/beta"],
        )

    def logits(self, hidden, w):
        pooled = ops.tanh(
            ops.matmul(hidden[:, 0], w["pooled_dense/kernel"]) + w["pooled_dense/bias"]
        )
        return ops.matmul(pooled, w["head/kernel"]) + w["head/bias"]

    def clean(self, w, layers):
        hidden = self.embed(w)
        for index in range(layers):
            hidden = self.layer(w, index, hidden)
        return self.logits(hidden, w)

    def adversarial(self, w, keeps, constants):
        """Logits with each layer's mask ``keeps[l]``; ``constants[l]`` holds
        its values for the ``1[A >= 0]`` factor (no gradient, as torch.ge)."""
        hidden = self.embed(w)
        for index, (keep, constant) in enumerate(zip(keeps, constants)):
            hidden = self.layer(w, index, hidden, keep, constant)
        return self.logits(hidden, w)

    def adversary_masks(self, w, adversaries):
        """Each layer's binary mask, scores and entering hidden states."""
        hidden = self.embed(w)
        found = []
        for index, adversary in enumerate(adversaries):
            entering = np.asarray(hidden)
            scores = _adversary_scores(adversary, entering, self.padding)
            keep = (scores > 0).astype("float32")
            found.append((keep, scores, entering))
            hidden = self.layer(w, index, hidden, keep, keep)
        return found


def _symmetric_kl(clean, adversarial):
    p = ops.log_softmax(clean, axis=-1)
    q = ops.log_softmax(adversarial, axis=-1)
    kl_pq = ops.sum(ops.exp(p) * (p - q))
    kl_qp = ops.sum(ops.exp(q) * (q - p))
    return 0.5 * (kl_pq + kl_qp) / clean.shape[0]


def test_a_compiled_fit_step_has_the_loss_and_gradients_of_an_independent_computation():
    """One `train_on_batch` under XLA with SGD(lr=1): each weight moves by
    exactly minus its gradient. Encoder and head: d(task + D); adversaries:
    the reversed d(D + tau^2 kept units / rows), through sigmoid'."""
    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(hidden_dim=16, num_heads=2, intermediate_dim=24)
    )
    model = _classifier(backbone)
    _large_kernels(model, seed=9)
    trainer = keras_masking.methods.ASATrainer(model, tau=TAU)
    for index, adversary in enumerate(trainer.adversaries):
        randomize_weights(adversary, seed=10 + index, scale=0.4)
    features = random_features(batch=4, length=8, seed=11)
    features["padding_mask"][2, 5:] = 0
    labels = np.array([0, 2, 1, 2])
    before = _snapshot(trainer)
    weights = {path: value for path, value in before.items() if not path.startswith("adversary")}
    reference = _ReferenceBert(weights, features, heads=2)
    found = reference.adversary_masks(weights, trainer.adversaries)
    keeps = [mask for mask, _, _ in found]
    assert 0 < np.mean(keeps) < 1  # the adversaries mask some pairs and keep others

    names = sorted(weights)

    def objective(*values):
        w = dict(zip(names, values))
        clean = reference.clean(w, 2)
        adversarial = reference.adversarial(w, keeps, keeps)
        return CE(labels, clean) + _symmetric_kl(clean, adversarial)

    expected_loss, expected_grads = value_and_gradients(objective, [weights[n] for n in names])

    # The adversaries: dD/dM (M continuous, the 1[A >= 0] factor held), then
    # plus tau^2 / rows, times sigmoid'(S), through S, reversed.
    clean_logits = reference.clean(weights, 2)

    def divergence_of_masks(*masks):
        adversarial = reference.adversarial(weights, list(masks), keeps)
        return _symmetric_kl(clean_logits, adversarial)

    divergence, mask_grads = value_and_gradients(divergence_of_masks, keeps)
    assert divergence > 0.01  # the attack matters, so its gradient terms are checked

    trainer.compile(optimizer=keras.optimizers.SGD(1.0), loss=CE, jit_compile=True)
    logs = trainer.train_on_batch(features, labels, return_dict=True)
    after = _snapshot(trainer)

    np.testing.assert_allclose(logs["loss"], expected_loss, rtol=1e-5)
    np.testing.assert_allclose(logs["divergence"], divergence, rtol=1e-4, atol=1e-7)
    kept = sum(mask.sum() for mask in keeps) / 4
    np.testing.assert_allclose(logs["mask_term"], TAU**2 * kept, rtol=1e-6)
    real = reference.padding[:, :, None] * reference.padding[:, None, :]
    for index, mask in enumerate(keeps):
        fraction = ((1 - mask) * real).sum() / real.sum()
        np.testing.assert_allclose(logs[f"masked_fraction_{index}"], fraction, rtol=1e-6)
    for name, grad in zip(names, expected_grads):
        np.testing.assert_allclose(
            before[name] - after[name], grad, rtol=2e-3, atol=2e-6, err_msg=name
        )
    for index, adversary in enumerate(trainer.adversaries):
        mask, scores, hidden = found[index]
        s = _sigmoid(scores.astype("float64"))
        upstream = ((mask_grads[index] + TAU**2 / 4) * s * (1 - s)).astype("float32")
        order = ["query/kernel", "query/bias", "key/kernel", "key/bias"]

        def scores_of(wq, bq, wk, bk, hidden=hidden, upstream=upstream):
            q = ops.matmul(hidden, wq) + bq
            k = ops.matmul(hidden, wk) + bk
            return ops.sum(ops.einsum("bqd,bkd->bqk", q, k) / 4.0 * upstream)

        prefix = adversary.path
        _, vjp = value_and_gradients(scores_of, [before[f"{prefix}/{n}"] for n in order])
        assert np.abs(mask_grads[index]).max() > 1e-3  # the divergence reaches this adversary
        for name, grad in zip(order, vjp):
            path = f"{prefix}/{name}"
            # The step ascends for the adversary: its weight moves by +VJP.
            np.testing.assert_allclose(
                after[path] - before[path], grad, rtol=2e-3, atol=2e-6, err_msg=path
            )
    assert set(logs) == {
        "loss",
        "divergence",
        "mask_term",
        "masked_fraction_0",
        "masked_fraction_1",
    }


def _tiny_trainer(position="absolute", batch=3, task_model=None, **asa_kwargs):
    keras.utils.set_random_seed(1)
    backbone = TransformerBackbone(**tiny_backbone_kwargs(position))
    model = task_model(backbone) if task_model else _classifier(backbone)
    _large_kernels(model, seed=12)
    trainer = keras_masking.methods.ASATrainer(model, **asa_kwargs)
    for index, adversary in enumerate(trainer.adversaries):
        randomize_weights(adversary, seed=20 + index, scale=0.4)
    return trainer, model, random_features(batch=batch, length=8, seed=13)


def _keep_every_real_pair(trainer):
    """Adversaries whose scores are +sqrt(d) on real keys: M = the padding."""
    for adversary in trainer.adversaries:
        for projection in (adversary.query, adversary.key):
            projection.kernel.assign(np.zeros(projection.kernel.shape))
            projection.bias.assign(np.ones(projection.bias.shape))


@pytest.mark.parametrize("position", ["absolute", "rotary", "relative"])
def test_an_adversary_keeping_every_real_pair_gives_the_clean_pass(position):
    trainer, model, features = _tiny_trainer(position)
    _keep_every_real_pair(trainer)
    outputs = trainer(features, training=True)
    np.testing.assert_allclose(outputs["adversarial"], outputs["clean"], atol=1e-5)
    real = features["padding_mask"]
    for mask in outputs["masks"]:
        np.testing.assert_array_equal(mask, np.broadcast_to(real[:, None, :], mask.shape))
    # Inference is the task model itself, bit for bit.
    np.testing.assert_array_equal(
        np.asarray(trainer(features, training=False)), np.asarray(model(features, training=False))
    )


def test_keras_hub_models_go_through_from_keras_hub_and_back():
    """A keras-hub backbone is refused with the conversion recipe; converted
    (RoBERTa: no segments, no pooler), it is attacked and converts back."""
    import keras_hub

    from tests.testing import HUB_SIZES

    bert = keras_hub.models.BertBackbone(**HUB_SIZES)
    refused = keras.Model(bert.input, keras.layers.Dense(2)(bert(bert.input)["pooled_output"]))
    with pytest.raises(ValueError, match="from_keras_hub"):
        keras_masking.methods.ASATrainer(refused)
    hub = keras_hub.models.RobertaBackbone(**HUB_SIZES)
    features = random_features(batch=2, length=8)
    features = {name: features[name] for name in hub.input}
    backbone = keras_masking.models.from_keras_hub(hub)
    trainer = keras_masking.methods.ASATrainer(_classifier(backbone, classes=2))
    _keep_every_real_pair(trainer)
    outputs = trainer(features, training=True)
    np.testing.assert_allclose(outputs["adversarial"], outputs["clean"], atol=1e-5)
    converted = backbone.to_keras_hub()
    assert isinstance(converted, keras_hub.models.RobertaBackbone)
    np.testing.assert_allclose(
        converted(features), backbone(features)["sequence_output"], atol=1e-5
    )


def _multiple_choice(backbone, choices=2, length=8):
    inputs = {
        name: keras.Input((choices, length), dtype="int32", name=name)
        for name in ("token_ids", "segment_ids", "padding_mask")
    }
    flat = {name: ops.reshape(tensor, (-1, length)) for name, tensor in inputs.items()}
    scores = keras.layers.Dense(1, name="head")(backbone(flat)["pooled_output"])
    return keras.Model(inputs, ops.reshape(scores, (-1, choices)))


def _token_classifier(backbone):
    logits = keras.layers.Dense(3, name="head")(backbone(backbone.input)["sequence_output"])
    return keras.Model(backbone.input, logits)


def _regressor(backbone):
    return _classifier(backbone, classes=1)


def test_task_kinds_and_their_normalisers():
    # Multiple choice: (B, C) logits, D per example / B; the mask term / (B x C).
    trainer, _, features = _tiny_trainer(task_model=_multiple_choice, batch=4)
    assert trainer.task == "classification"
    grouped = {name: value.reshape(2, 2, -1) for name, value in features.items()}
    outputs = trainer(grouped, training=True)
    assert tuple(outputs["masks"][0].shape)[0] == 4  # the encoder's rows
    kept = sum(np.asarray(mask).sum() for mask in outputs["masks"])
    np.testing.assert_allclose(trainer.mask_term(outputs), TAU**2 * kept / 4, rtol=1e-6)
    expected = _official_divergence(
        np.asarray(outputs["clean"], "float64"), np.asarray(outputs["adversarial"], "float64")
    )
    np.testing.assert_allclose(trainer.divergence(outputs), expected, rtol=1e-4)
    # Token classification: summed over positions (padding included) / B.
    trainer, _, features = _tiny_trainer(task_model=_token_classifier)
    assert trainer.task == "token_classification"
    outputs = trainer(features, training=True)
    clean, adversarial = (np.asarray(outputs[k], "float64") for k in ("clean", "adversarial"))
    np.testing.assert_allclose(
        trainer.divergence(outputs), _official_divergence(clean, adversarial), rtol=1e-4
    )
    real_only, _, _ = _tiny_trainer(task_model=_token_classifier, token_divergence="real")
    real_outputs = real_only(features, training=True)
    real = features["padding_mask"].astype(bool)
    np.testing.assert_allclose(
        real_only.divergence(real_outputs),
        _official_divergence(
            np.asarray(real_outputs["clean"], "float64")[real][None],
            np.asarray(real_outputs["adversarial"], "float64")[real][None],
        )
        / 3,
        rtol=1e-4,
    )
    # Regression: the softmax over the batch.
    trainer, _, features = _tiny_trainer(task_model=_regressor)
    assert trainer.task == "regression"
    outputs = trainer(features, training=True)
    clean, adversarial = (np.asarray(outputs[k], "float64") for k in ("clean", "adversarial"))
    np.testing.assert_allclose(
        trainer.divergence(outputs), _official_divergence(clean, adversarial), rtol=1e-4
    )


def test_span_heads_need_an_explicit_divergence():
    def span(backbone):
        logits = keras.layers.Dense(1)(backbone(backbone.input)["sequence_output"])
        return keras.Model(backbone.input, keras.layers.Reshape((-1,))(logits))

    with pytest.raises(ValueError, match="span or pointer"):
        _tiny_trainer(task_model=span)

    def squared(clean, adversarial):
        return ops.mean(ops.square(clean - adversarial))

    trainer, _, features = _tiny_trainer(task_model=span, divergence=squared)
    outputs = trainer(features, training=True)
    np.testing.assert_allclose(
        trainer.divergence(outputs),
        np.mean((np.asarray(outputs["clean"]) - np.asarray(outputs["adversarial"])) ** 2),
        rtol=1e-5,
    )


def test_combinations_that_make_no_sense_are_refused():
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    dropping = TransformerBackbone(**tiny_backbone_kwargs())
    dropping.enable_drop_token(0.2, mode="gather")
    for encoder, reason in [
        (dropping, "gather mode"),
        (
            keras_masking.models.ExLMEncoder(
                TransformerBackbone(**tiny_backbone_kwargs("rotary2d", custom_position_ids=True)),
                k=2,
                mask_token_id=3,
                unselectable_token_ids=(1, 2),
            ),
            "ExLMEncoder",
        ),
    ]:
        inputs = {
            name: keras.Input((None,), dtype="int32", name=name)
            for name in ("token_ids", "segment_ids", "padding_mask")
        }
        model = keras.Model(inputs, keras.layers.Dense(2)(encoder(inputs)["pooled_output"]))
        with pytest.raises(ValueError, match=reason):
            keras_masking.methods.ASATrainer(model)

    class Subclassed(keras.Model):
        def call(self, inputs):
            return backbone(inputs)["pooled_output"]

    with pytest.raises(ValueError, match="functional"):
        keras_masking.methods.ASATrainer(Subclassed())
    plain = keras.Input((4,))
    with pytest.raises(ValueError, match="calling 0 such encoders"):
        keras_masking.methods.ASATrainer(keras.Model(plain, keras.layers.Dense(2)(plain)))
    model = _classifier(backbone)
    for kwargs, message in [
        ({"tau": -1.0}, r"Expected tau in \[0.0, inf\). Received: tau=-1.0"),
        ({"tau": float("inf")}, r"Expected a finite number for tau. Received: tau=inf"),
        ({"alpha": float("inf")}, r"Expected a finite number for alpha. Received: alpha=inf"),
        ({"alpha": np.float32(np.inf)}, "Expected a finite number for alpha"),
        ({"tau": float("nan")}, "Expected a number for tau"),
        ({"tau": True}, "Expected a number for tau"),
        ({"alpha": "1"}, "Expected a number for alpha. Received: alpha='1'"),
        ({"alpha": -0.5}, "alpha"),
        ({"noise": 1}, "Expected True or False for noise"),
        ({"seed": 1.5}, "Expected an integer for seed"),
        ({"seed": -1}, "seed"),
        ({"layers": [0.5]}, "layer"),
        ({"divergence": "kl"}, "callable"),
        ({"mask_semantics": "multiply"}, "mask_semantics"),
        ({"token_divergence": "real"}, "token classification only"),
        ({"task": "ranking"}, "task"),
        ({"layers": [5]}, "every entry of layers"),
        ({"task": "token_classification"}, "rank 3"),
    ]:
        with pytest.raises(ValueError, match=message):
            keras_masking.methods.ASATrainer(model, **kwargs)
    # Numpy scalars are numbers.
    trainer = keras_masking.methods.ASATrainer(
        model, tau=np.float32(0.25), alpha=np.float64(1.0), seed=np.int64(3)
    )
    assert (trainer.tau, trainer.alpha, trainer.seed) == (0.25, 1.0, 3)


def test_drop_token_attention_mode_is_attacked_with_its_dropping_kept():
    """With adversaries that keep every real pair, the adversarial pass is the
    DropToken encoder's own training pass: its second draw of dropped tokens,
    applied on top of the adversaries' masks."""
    keras.utils.set_random_seed(2)
    encoder = TransformerBackbone(**tiny_backbone_kwargs())
    encoder.enable_drop_token(0.3, mode="attention", seed=3)
    model = keras.Model(
        encoder.input, keras.layers.Dense(2)(encoder(encoder.input)["pooled_output"])
    )
    _large_kernels(model, seed=5)
    trainer = keras_masking.methods.ASATrainer(model)
    _keep_every_real_pair(trainer)
    features = random_features(batch=2, length=8)
    state = encoder.drop_token.seed_generator.state
    start = np.asarray(state.numpy())
    outputs = trainer(features, training=True)  # draws: clean, then adversarial
    assert len(outputs["masks"]) == 2
    state.assign(start)
    clean = np.asarray(model(features, training=True))
    dropped = np.asarray(model(features, training=True))
    np.testing.assert_allclose(np.asarray(outputs["clean"]), clean, atol=1e-5)
    np.testing.assert_allclose(np.asarray(outputs["adversarial"]), dropped, atol=1e-5)
    # The draws dropped tokens (the passes differ from a pass that drops none).
    undropped = np.asarray(model(features, training=False))
    assert np.abs(dropped - undropped).max() > 1e-2
    assert np.abs(dropped - clean).max() > 1e-2


def _trainable_changes(trainer, features, labels):
    trainer.compile(optimizer=keras.optimizers.SGD(0.1), loss=CE)
    _, grads = model_gradients(trainer, features, labels)
    return {path for path, grad in grads.items() if np.abs(grad).max() > 0}


@pytest.mark.parametrize("method", ["fl", "prefix", "lora"])
def test_parameter_efficient_methods_train_their_weights_and_the_adversaries(method):
    keras.utils.set_random_seed(4)
    backbone = TransformerBackbone(**tiny_backbone_kwargs(num_layers=1))
    model = _classifier(backbone, classes=2)
    if method == "fl":
        backbone.enable_fl_tuning(units=4)
    elif method == "prefix":
        backbone.enable_prefix_tuning(length=3)
    else:
        backbone.enable_lora(2)
    trainer = keras_masking.methods.ASATrainer(model)
    changed = _trainable_changes(trainer, random_features(batch=2, length=8), np.array([0, 1]))
    marker = {"fl": "add_ffn", "prefix": "key_value_prefix", "lora": "lora_kernel"}[method]
    assert any(marker in path for path in changed)
    assert any(path.startswith("adversary_0/") for path in changed)
    assert {v.path for v in trainer.trainable_variables} == (
        {v.path for v in model.trainable_variables}
        | {v.path for adversary in trainer.adversaries for v in adversary.trainable_variables}
    )


def test_the_embedding_correction_callback_finds_the_embedding_through_the_trainer():
    trainer, model, _ = _tiny_trainer()
    table = np.asarray(trainer.backbone.token_embedding.embeddings)
    callback = keras_masking.callbacks.MLMEmbeddingCorrection(mask_token_id=3)
    callback.set_model(trainer)
    callback.on_train_begin()
    corrected = np.asarray(trainer.backbone.token_embedding.embeddings)
    expected = 0.85 * table + 0.15 * (0.8 * table[3] + 0.1 * table + 0.1 * table.mean(0))
    np.testing.assert_allclose(corrected, expected, atol=1e-6)


def test_tau_zero_removes_exactly_the_mask_penalty_from_the_adversary_gradient():
    features = random_features(batch=2, length=8, seed=14)
    labels = np.array([1, 2])
    grads = {}
    for tau in (0.0, TAU):
        trainer, _, _ = _tiny_trainer(tau=tau)
        trainer.compile(optimizer=keras.optimizers.SGD(0.1), loss=CE)
        grads[tau] = model_gradients(trainer, features, labels)[1]
        outputs = trainer(features, training=True)
        if tau == 0.0:
            assert float(trainer.mask_term(outputs)) == 0.0
    hidden = np.asarray(trainer.backbone.embed(features["token_ids"], features["segment_ids"]))
    adversary = trainer.adversaries[0]
    scores = _adversary_scores(adversary, hidden, features["padding_mask"].astype("float32"))
    s = _sigmoid(scores)
    order = ["query/kernel", "query/bias", "key/kernel", "key/bias"]
    w = {v.path.split("/", 1)[1]: np.asarray(v) for v in adversary.weights}

    def penalty(wq, bq, wk, bk):
        q = ops.matmul(hidden, wq) + bq
        k = ops.matmul(hidden, wk) + bk
        scores = ops.einsum("bqd,bkd->bqk", q, k) / np.sqrt(32.0)
        return ops.sum(scores * (TAU**2 / 2 * s * (1 - s)))

    _, expected = value_and_gradients(penalty, [w[name] for name in order])
    for name, want in zip(order, expected):
        path = f"adversary_0/{name}"
        # The divergence's share (x 10000 per head) is large: allow its rounding.
        rounding = 1e-5 * np.abs(grads[0.0][path]).max()
        np.testing.assert_allclose(
            grads[TAU][path] - grads[0.0][path], -want, rtol=1e-3, atol=rounding + 1e-7
        )
    for path in grads[TAU]:  # two compiled graphs: float32 rounding apart
        if not path.startswith("adversary"):
            np.testing.assert_allclose(grads[TAU][path], grads[0.0][path], rtol=1e-3, atol=1e-4)


def test_a_batch_of_one_and_mixed_precision():
    trainer, _, features = _tiny_trainer(batch=1)
    trainer.compile(optimizer=keras.optimizers.SGD(0.1), loss=CE)
    outputs = trainer(features, training=True)
    loss = trainer.compute_loss(features, np.array([1]), outputs)
    expected = float(CE(np.array([1]), outputs["clean"])) + float(trainer.divergence(outputs))
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    regression, _, _ = _tiny_trainer(task_model=_regressor, batch=1)
    assert float(regression.divergence(regression(features, training=True))) == 0.0
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        trainer, _, features = _tiny_trainer()
        outputs = trainer(features, training=True)
        for mask in outputs["masks"]:
            assert keras.backend.standardize_dtype(mask.dtype) == "float32"
            assert set(np.unique(np.asarray(mask))) <= {0.0, 1.0}
        trainer.compile(optimizer=keras.optimizers.SGD(0.1), loss=CE)
        loss, grads = model_gradients(trainer, features, np.array([0, 1, 2]))
        assert np.isfinite(loss) and all(np.isfinite(g).all() for g in grads.values())
    finally:
        keras.config.set_dtype_policy(previous)


def test_a_regression_batch_of_one_warns_that_its_divergence_is_zero(caplog):
    labels = np.array([[0.5], [-1.0], [2.0]], "float32")
    for batch in (2, 1):
        trainer, _, features = _tiny_trainer(task_model=_regressor)
        trainer.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        caplog.clear()
        with caplog.at_level("WARNING", logger="keras_masking"):
            subset = {name: value[:batch] for name, value in features.items()}
            logs = trainer.fit(subset, labels[:batch], batch_size=batch, verbose=0).history
        if batch == 1:
            assert logs["divergence"] == [0.0]
            assert "batch of 1 row it is exactly 0" in caplog.text
        else:
            assert logs["divergence"][0] > 0.0
            assert "exactly 0" not in caplog.text


def test_saving_keeps_adversaries_in_the_trainer_only(tmp_path):
    trainer, model, features = _tiny_trainer()
    hidden = trainer.backbone.hidden_dim
    adversary_weights = sum(
        int(np.prod(v.shape)) for adversary in trainer.adversaries for v in adversary.weights
    )
    assert adversary_weights == 2 * 2 * (hidden * hidden + hidden)
    assert trainer.count_params() == model.count_params() + adversary_weights
    trainer.save(tmp_path / "trainer.keras")
    restored = keras.saving.load_model(tmp_path / "trainer.keras")
    assert isinstance(restored, keras_masking.methods.ASATrainer)
    for original, loaded in zip(trainer.weights, restored.weights):
        np.testing.assert_array_equal(np.asarray(original), np.asarray(loaded))
    np.testing.assert_array_equal(
        np.asarray(restored.inference_model(features)), np.asarray(model(features))
    )
    trainer.inference_model.save(tmp_path / "model.keras")
    inference = keras.saving.load_model(tmp_path / "model.keras")
    assert not any("adversary" in v.path for v in inference.weights)
    assert inference.count_params() == model.count_params()


def test_noise_is_a_named_option():
    trainer, _, features = _tiny_trainer()
    first = [np.asarray(m) for m in trainer(features, training=True)["masks"]]
    second = [np.asarray(m) for m in trainer(features, training=True)["masks"]]
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)  # official: deterministic
    noisy, _, _ = _tiny_trainer(noise=True, seed=5)
    first = np.asarray(noisy(features, training=True)["masks"][0])
    second = np.asarray(noisy(features, training=True)["masks"][0])
    assert (first != second).any()


def test_noise_draws_in_every_training_pass_of_an_asa_classifier():
    """The adversaries were called without the training flag: on JAX (whose fit
    calls the model's `call`, not `__call__`) `noise=True` drew nothing, and the
    seed changed nothing; `adversarial_forward(training=True)` drew nothing."""
    backbone = TransformerBackbone(**tiny_backbone_kwargs(dropout=0.0))
    classifier = keras_masking.models.TransformerTextClassifier(backbone, num_classes=2)
    classifier.enable_asa(tau=0.5, noise=True, seed=5)
    features = random_features(batch=4, length=10)
    first, second = (
        [np.asarray(mask) for mask in backbone.adversarial_forward(features, training=True)[1]]
        for _ in range(2)
    )
    assert all((a != b).any() for a, b in zip(first, second))
    counters = lambda: [  # noqa: E731
        int(np.asarray(adversary.seed_generator.state)[1])
        for adversary in backbone.attention_adversaries
    ]
    before = counters()
    classifier.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True))
    classifier.fit(features, np.array([0, 1, 0, 1]), batch_size=2, verbose=0)
    assert [after - start for after, start in zip(counters(), before)] == [2, 2]  # 2 steps


def test_adversaries_and_drop_token_draw_from_streams_of_their_own():
    """Adversary i took seed + i: seed 0's second adversary drew seed 1's first one's
    noise, and DropToken given the same seed drew the first adversary's numbers."""
    states = {}
    for seed in range(3):
        backbone = TransformerBackbone(**tiny_backbone_kwargs(num_layers=3))
        backbone.enable_drop_token(0.3, mode="attention", seed=seed)
        backbone.enable_asa(noise=True, seed=seed)
        states[f"drop_token_{seed}"] = backbone.token_dropping.seed_generator.state
        for index, adversary in enumerate(backbone.attention_adversaries):
            states[f"adversary_{index}_{seed}"] = adversary.seed_generator.state
    shape = (2, 8, 8)
    draws = {name: np.asarray(keras.random.uniform(shape, seed=keras.random.SeedGenerator(
        int(np.asarray(state)[0])))) for name, state in states.items()}  # fmt: skip
    names = sorted(draws)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            assert np.abs(draws[first] - draws[second]).max() > 0.1, (first, second)
    assert backbone.get_config()["asa"]["seed"] == 2  # the seed given is what is kept


def test_masked_fraction_plot(tmp_path):
    history = {
        "loss": [1.0, 0.5],
        "masked_fraction_0": [0.4, 0.3],
        "masked_fraction_1": [0.2, 0.1],
    }
    layers, fractions = keras_masking.methods.masked_fractions_by_layer(history)
    assert layers == [0, 1]
    np.testing.assert_array_equal(fractions, [[0.4, 0.2], [0.3, 0.1]])
    with pytest.raises(ValueError, match="masked_fraction"):
        keras_masking.methods.masked_fractions_by_layer({"loss": [1.0]})
    pytest.importorskip("matplotlib")
    path = tmp_path / "masks.png"
    keras_masking.methods.plot_masked_fractions(history, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_trainer_refuses_settings_that_differ_from_the_backbones():
    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(
        vocabulary_size=32, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
        max_sequence_length=8,
    )  # fmt: skip
    logits = keras.layers.Dense(2)(backbone(backbone.input)["pooled_output"])
    model = keras.Model(backbone.input, logits)
    backbone.enable_asa(tau=0.3, layers=[1])
    with pytest.raises(ValueError, match=r"tau=1\.0 \(the backbone's tau=0\.3\)"):
        keras_masking.methods.ASATrainer(model, tau=1.0)
    with pytest.raises(ValueError, match=r"layers=\[0\] \(the backbone's layers=\[1\]\)"):
        keras_masking.methods.ASATrainer(model, layers=[0])
    trainer = keras_masking.methods.ASATrainer(model, tau=0.3)  # the same value: accepted
    assert trainer.tau == trainer.asa_tau == 0.3 and trainer.attacked_layers == [1]
    assert keras_masking.methods.ASATrainer(model).tau == 0.3  # none given: the backbone's
