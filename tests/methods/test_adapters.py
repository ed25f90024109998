"""Bad input to FL-tuning, prefix tuning, merging, adapter files and their layers.

Every case asserts a clear error (the argument or file named, what was
expected) and that the model is exactly as before: same layers, same
weights, same trainable flags, same backbone config. Valid retries then work.
`CASES` lists the cases per public entry point; `test_every_entry_point_is_tried`
counts them.
"""

import collections
import json
import logging
import os
import zipfile

import keras
import keras_hub
import numpy as np
import pytest

from keras_masking.layers import AddFFN
from keras_masking.layers import KeyValuePrefix
from keras_masking.layers.key_value_prefix import PrefixEncoder
from keras_masking.layers.key_value_prefix import key_value_prefixes
from keras_masking.methods import AdapterSet
from keras_masking.methods import ParameterReport
from keras_masking.methods import add_ffn_parameter_count
from keras_masking.methods import load_adapter
from keras_masking.methods import model_backbone
from keras_masking.methods import parameter_report
from keras_masking.methods import read_adapter
from keras_masking.methods import save_adapter
from keras_masking.models import TransformerBackbone
from tests.testing import HUB_SIZES
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs

UNITS = 4


def _classifier(seed=0, head=3, **overrides):
    backbone = TransformerBackbone(**tiny_backbone_kwargs(**overrides))
    randomize_weights(backbone, seed=seed)
    inputs = backbone.input
    logits = keras.layers.Dense(head, name="head")(backbone(inputs)["pooled_output"])
    model = keras.Model(inputs, logits)
    randomize_weights(model.get_layer("head"), seed=seed + 1)
    return model, backbone


def snapshot(model):
    """Everything a refused call must leave alone."""
    layers = [
        (type(layer).__name__, layer.name, bool(layer.trainable))
        for layer in model._flatten_layers(include_self=True)
    ]
    weights = [
        (v.path, tuple(v.shape), bool(v.trainable), keras.ops.convert_to_numpy(v).copy())
        for v in model.weights
    ]
    backbones = [layer for layer in model.layers if isinstance(layer, TransformerBackbone)]
    backbones = backbones or [model_backbone(model)]
    configs = [json.dumps(b.get_config(), sort_keys=True) for b in backbones]
    attached = [
        (b.feed_forward_branch, b.key_value_prefix, b.attention_units)
        for backbone in backbones
        for b in backbone.transformer_layers
    ]
    return layers, weights, configs, attached


def assert_unchanged(model, before):
    layers, weights, configs, attached = snapshot(model)
    assert layers == before[0]
    assert configs == before[2]
    assert [w[:3] for w in weights] == [w[:3] for w in before[1]]
    for (path, _, _, value), (_, _, _, old) in zip(weights, before[1]):
        np.testing.assert_array_equal(value, old, err_msg=path)
    assert all(all(x is y for x, y in zip(new, old)) for new, old in zip(attached, before[3]))


@pytest.fixture(scope="module")
def plain():
    """An untuned classifier."""
    return _classifier()[0]


@pytest.fixture(scope="module")
def tuned():
    """An FL-tuned classifier with random branches."""
    model, backbone = _classifier(seed=2)
    backbone.enable_fl_tuning(units=UNITS)
    for block in backbone.transformer_layers:
        randomize_weights(block.feed_forward_branch, seed=5, scale=0.3)
    return model


@pytest.fixture(scope="module")
def ma_tuned():
    model, backbone = _classifier(seed=3)
    backbone.enable_fl_tuning(units=UNITS, attention_units=2)
    return model


@pytest.fixture(scope="module")
def merged(tuned):
    """The tuned classifier's backbone, merged."""
    return model_backbone(tuned).merge_fl()


@pytest.fixture(scope="module")
def adapter_files(tmp_path_factory, tuned):
    folder = tmp_path_factory.mktemp("adapters")
    good = save_adapter(tuned, folder / "good", name="good")
    files = {"good": good, "folder": str(folder)}
    with open(good, "rb") as file:
        data = file.read()

    def write(name, content):
        path = str(folder / name)
        with open(path, "wb") as file:
            file.write(content)
        files[name] = path

    write("truncated.npz", data[: len(data) // 2])
    write("empty.npz", b"")
    write("text.npz", b"these are not the weights you are looking for\n")
    np.save(str(folder / "array.npy"), np.zeros(3, "float32"))
    files["array.npy"] = str(folder / "array.npy")
    description, arrays = read_adapter(good)

    def rewrite(name, description, arrays):
        path = str(folder / name)
        numbered = {f"v{i}": a for i, a in enumerate(arrays)}
        np.savez(path, __adapter__=np.array(json.dumps(description)), **numbered)
        files[name] = path

    # A member whose bytes are flipped: the zip's CRC check fails on reading.
    corrupt = bytearray(data)
    with zipfile.ZipFile(good) as archive:
        info = archive.getinfo("v0.npy")
    start = info.header_offset + 30 + len(info.filename) + 200
    corrupt[start : start + 8] = b"\xff" * 8
    write("corrupt.npz", bytes(corrupt))
    files["no_description.npz"] = str(folder / "no_description.npz")
    np.savez(files["no_description.npz"], **{f"v{i}": a for i, a in enumerate(arrays)})
    path = str(folder / "bad_json.npz")
    np.savez(path, __adapter__=np.array("{not json"), v0=arrays[0])
    files["bad_json.npz"] = path
    rewrite("other_format.npz", {**description, "format": "something.else"}, arrays)
    rewrite("newer.npz", {**description, "version": 99}, arrays)
    rewrite("no_method.npz", {**description, "method": {}}, arrays)
    bad_units = {**description["method"], "add_ffn": {"units": "4", "layers": [0, 1]}}
    rewrite("bad_units.npz", {**description, "method": bad_units}, arrays)
    rewrite("missing_array.npz", description, arrays[:-1])
    rewrite("int_arrays.npz", description, [a.astype("int32") for a in arrays])
    # Consistent inside (description and arrays agree), but the addFFN arrays
    # have 5 units while the description says 4: only the model can tell.
    wrong = [np.zeros((32, 5), "float32"), np.zeros((5,), "float32"), *arrays[2:]]
    wrong[2] = np.zeros((5, 32), "float32")
    variables = [[n, list(a.shape)] for (n, _), a in zip(description["variables"], wrong)]
    rewrite("wrong_shapes.npz", {**description, "variables": variables}, wrong)
    # Shapes right, names swapped: a kernel stored where a bias belongs.
    swapped = [list(v) for v in description["variables"]]
    swapped[0][0] = "bias"
    rewrite("wrong_names.npz", {**description, "variables": swapped}, arrays)
    # v1 files (no variable list) still load; v1 reparameterised prefixes do not.
    old = {k: v for k, v in description.items() if k != "variables"}
    rewrite("version1.npz", {**old, "version": 1}, arrays)
    prefix = {"length": 2, "layers": [0, 1], "dropout": 0.1, "reparameterize": True}
    old_method = {**old["method"], "key_value_prefix": {**prefix, "hidden_units": 8}}
    rewrite("version1_mlp.npz", {**old, "version": 1, "method": old_method}, arrays)
    # Adapters for other models.
    for name, overrides, head in (
        ("other_hidden", dict(hidden_dim=64), 3),
        ("other_head", dict(), 5),
        ("other_layers", dict(num_layers=3), 3),
        ("other_ffn", dict(intermediate_dim=40), 3),
    ):
        other, other_backbone = _classifier(head=head, **overrides)
        other_backbone.enable_fl_tuning(units=UNITS)
        files[name] = save_adapter(other, folder / name)
    other, other_backbone = _classifier()
    other_backbone.enable_fl_tuning(units=UNITS + 1)
    files["other_units"] = save_adapter(other, folder / "other_units")
    other, other_backbone = _classifier()
    other_backbone.enable_prefix_tuning(length=2)
    files["prefix"] = save_adapter(other, folder / "prefix")
    return files


def _cases():
    """(entry point, case id, call(models, files), exception, message, model to check)."""
    t = "tuned"
    p = "plain"
    cases = []

    def add(entry, case, call, error, match, model=p):
        cases.append((entry, case, call, error, match, model))

    def fl(model, **kwargs):
        model_backbone(model).enable_fl_tuning(**kwargs)

    for case, kwargs, match in (
        ("units=0", dict(units=0), "units >= 1"),
        ("units=-1", dict(units=-1), "units=-1"),
        ("units=2.5", dict(units=2.5), "Expected an integer for units"),
        ("units=True", dict(units=True), "Expected an integer for units"),
        ("units='8'", dict(units="8"), "Expected an integer for units"),
        ("units=None", dict(units=None), "Expected an integer for units"),
        ("attention_units=-1", dict(units=4, attention_units=-1), "attention_units=-1"),
        ("attention_units=1.5", dict(units=4, attention_units=1.5), "attention_units"),
        ("attention_units=True", dict(attention_units=True), "attention_units"),
        (
            "layers=[2]",
            dict(layers=[2]),
            r"every entry of layers in \[0, 1\]\. Received: layers=\[2\]",
        ),
        ("layers=[-1]", dict(layers=[-1]), r"every entry of layers in \[0, 1\]"),
        ("layers=[0.5]", dict(layers=[0.5]), "list of integers for layers"),
        ("layers=[True]", dict(layers=[True]), "list of integers for layers"),
        ("layers=[]", dict(layers=[]), "non-empty list"),
        (
            "layers=[0, 0]",
            dict(layers=[0, 0]),
            r"distinct entries in layers\. Received: layers=\[0, 0\]",
        ),
        ("layers=1", dict(layers=1), "layers=1"),
        ("layers='0'", dict(layers="0"), "layers='0'"),
        ("layers=2d array", dict(layers=np.array([[0, 1]])), "for layers"),
    ):
        add("enable_fl_tuning", case, lambda m, f, kw=kwargs: fl(m[p], **kw), ValueError, match)
    add("enable_fl_tuning", "tuned twice", lambda m, f: fl(m[t], units=2), ValueError,
        "already has", t)  # fmt: skip
    add(
        "enable_fl_tuning",
        "keras-hub backbone converted, layers=[5]",
        lambda m, f: fl(TransformerBackbone.from_keras_hub(m["hub"]), layers=[5]),
        ValueError,
        r"every entry of layers in \[0, 1\]",
        "hub",
    )

    def pt(model, **kwargs):
        model_backbone(model).enable_prefix_tuning(**kwargs)

    for case, kwargs, match in (
        ("length=-1", dict(length=-1), "length=-1"),
        ("length=2.5", dict(length=2.5), "Expected an integer for length"),
        ("length=True", dict(length=True), "Expected an integer for length"),
        ("length='4'", dict(length="4"), "Expected an integer for length"),
        ("reparameterize=1", dict(reparameterize=1), "True or False for reparameterize"),
        ("reparameterize='yes'", dict(reparameterize="yes"), "reparameterize"),
        ("reparameterize=None", dict(reparameterize=None), "reparameterize"),
        ("layers=[5]", dict(layers=[5]), r"every entry of layers in \[0, 1\]"),
        ("layers=[1.0]", dict(layers=[1.0]), "list of integers for layers"),
        ("dropout=1.0", dict(dropout=1.0), r"dropout in \[0.0, 1.0\)"),
        ("dropout=-0.1", dict(dropout=-0.1), "dropout=-0.1"),
        ("dropout=nan", dict(dropout=float("nan")), "Expected a number for dropout"),
        ("dropout='0.1'", dict(dropout="0.1"), "Expected a number for dropout"),
        ("dropout=True", dict(dropout=True), "Expected a number for dropout"),
        ("hidden_units=0", dict(hidden_units=0), "hidden_units=0"),
        ("hidden_units=8.0", dict(hidden_units=8.0), "Expected an integer for hidden_units"),
    ):
        add("enable_prefix_tuning", case, lambda m, f, kw=kwargs: pt(m[p], **kw), ValueError, match)
    add(
        "enable_prefix_tuning",
        "prefixed twice",
        lambda m, f: pt(m["prefixed"], length=2),
        ValueError,
        "already has key/value prefixes",
        "prefixed",
    )

    def merge(model, *args):
        return model_backbone(model).merge_fl(*args)

    for case, placement, match in (
        ("placement='middle'", "middle", "placement='middle'"),
        ("placement=-1", -1, r"\[0, 48\] for placement"),
        ("placement=49", 49, "placement=49"),
        ("placement=True", True, "placement=True"),
        ("placement=2.0", 2.0, "placement=2.0"),
        ("placement=None", None, "placement=None"),
    ):
        add("merge_fl", case, lambda m, f, x=placement: merge(m[t], x), ValueError, match, t)
    add("merge_fl", "untuned", lambda m, f: merge(m[p]), ValueError, r"enable_fl_tuning\(\) first")
    add("merge_fl", "MA units", lambda m, f: merge(m["ma"]), ValueError, "do not merge", "ma")

    def unmerge(model, **kwargs):
        return model_backbone(model).unmerge_fl(**kwargs)

    mg = "merged"
    for case, kwargs, match in (
        ("units=0", dict(units=0), "units=0"),
        ("units=2.5", dict(units=2.5), "Expected an integer for units"),
        ("units=True", dict(units=True), "Expected an integer for units"),
        ("units=52", dict(units=52), "units < 52"),
        ("placement='end'", dict(placement="end"), "placement='end'"),
        ("placement=49", dict(placement=49), r"\[0, 48\] for placement"),
        ("layers=[2]", dict(layers=[2]), r"every entry of layers in \[0, 1\]"),
        ("layers=[0, 0]", dict(layers=[0, 0]), "distinct entries in layers"),
    ):
        add("unmerge_fl", case, lambda m, f, kw=kwargs: unmerge(m[mg], **kw), ValueError, match, mg)
    add("unmerge_fl", "no record", lambda m, f: unmerge(m[p]), ValueError, "no merge record")
    add("unmerge_fl", "still tuned", lambda m, f: unmerge(m[t], units=2), ValueError, "Merge it", t)

    count = add_ffn_parameter_count
    for case, args, match in (
        ("hidden_dim=0", (0, 4, 2), "hidden_dim=0"),
        ("units=-1", (32, -1, 2), "units=-1"),
        ("num_layers=2.5", (32, 4, 2.5), "Expected an integer for num_layers"),
        ("units=True", (32, True, 2), "Expected an integer for units"),
    ):
        add("add_ffn_parameter_count", case, lambda m, f, a=args: count(*a), ValueError, match)

    for case, call, error, match, model in (
        ("no adapter", lambda m, f: save_adapter(m[p], f["folder"] + "/x"), ValueError,
         "no adapter", p),
        ("missing folder", lambda m, f: save_adapter(m[t], f["folder"] + "/no/x"),
         FileNotFoundError, "no folder", t),
        ("path is a folder", lambda m, f: save_adapter(m[t], f["folder"] + "/dir.npz"),
         ValueError, "it is a folder", t),
        ("path=3", lambda m, f: save_adapter(m[t], 3), ValueError, "path=3", t),
        ("path=''", lambda m, f: save_adapter(m[t], ""), ValueError, "path=''", t),
        ("name=5", lambda m, f: save_adapter(m[t], f["folder"] + "/y", name=5), ValueError,
         "name=5", t),
        ("a Dense layer", lambda m, f: save_adapter(keras.layers.Dense(2), f["folder"] + "/z"),
         TypeError, "Received", p),
    ):  # fmt: skip
        add("save_adapter", case, call, error, match, model)

    for case, name, error, match in (
        ("missing file", "missing.npz", FileNotFoundError, "No adapter file at .*missing"),
        ("truncated zip", "truncated.npz", ValueError, "truncated.npz"),
        ("flipped bytes", "corrupt.npz", ValueError, "adapter file .*corrupt.npz is damaged"),
        ("empty file", "empty.npz", ValueError, "empty.npz"),
        ("text file", "text.npz", ValueError, "text.npz: it is not a readable"),
        ("single .npy", "array.npy", ValueError, "single numpy array"),
        ("no __adapter__", "no_description.npz", ValueError, "no __adapter__ entry"),
        ("description not JSON", "bad_json.npz", ValueError, "not JSON"),
        ("other format", "other_format.npz", ValueError, "not a keras_masking adapter file"),
        ("newer version", "newer.npz", ValueError, "version 99"),
        ("no method", "no_method.npz", ValueError, "names no addFFN, prefix, attention units or"),
        ("units a string", "bad_units.npz", ValueError, "add_ffn entry"),
        ("array missing", "missing_array.npz", ValueError, "missing_array.npz"),
        ("integer arrays", "int_arrays.npz", ValueError, "floating-point"),
        ("v1 MLP prefix", "version1_mlp.npz", ValueError, "one MLP per layer"),
        ("wrong shapes", "wrong_shapes.npz", ValueError, r"v0 has shape \(32, 5\)"),
        ("wrong names", "wrong_names.npz", ValueError, "v0 is a 'bias'"),
        ("other hidden size", "other_hidden", ValueError, "hidden_dim: adapter 64, model 32"),
        ("other head", "other_head", ValueError, "task head"),
        ("other layer count", "other_layers", ValueError, "num_layers"),
        ("other FFN size", "other_ffn", ValueError, "intermediate_dim"),
        ("a folder", "folder", ValueError, "Received a folder"),
        ("another base", "good", ValueError, "trained on another base model: its base weight"),
    ):
        # The array checks on their own: "plain" is not the base these were trained on.
        check_base = name not in ("wrong_shapes.npz", "wrong_names.npz")
        add(
            "load_adapter",
            case,
            lambda m, f, n=name, c=check_base: load_adapter(
                m[p], f.get(n, f["folder"] + "/" + n), check_base=c
            ),
            error,
            match,
        )
    for case, model, name, match in (
        ("other units", t, "other_units", "add_ffn: adapter"),
        ("prefix into FL model", t, "prefix", "add_ffn: the model has"),
    ):
        add(
            "load_adapter",
            case,
            lambda m, f, n=name, k=model: load_adapter(m[k], f[n]),
            ValueError,
            match,
            model,
        )
    add("load_adapter", "path=None", lambda m, f: load_adapter(m[p], None), ValueError, "path")
    add("load_adapter", "two backbones", lambda m, f: load_adapter(m["two"], f["good"]),
        ValueError, "exactly one backbone", "two")  # fmt: skip

    for case, name, error, match in (
        ("missing file", "nothing_here", FileNotFoundError, "nothing_here"),
        ("flipped bytes", "corrupt.npz", ValueError, "corrupt.npz"),
        ("path=1.5", None, ValueError, "path=1.5"),
    ):
        add(
            "read_adapter",
            case,
            lambda m, f, n=name: read_adapter(f["folder"] + "/" + n if n else 1.5),
            error,
            match,
        )

    def adapter_set(m, f):
        adapters = AdapterSet(m[t])
        adapters.add("a")
        return adapters

    for case, call, error, match in (
        ("model=Dense", lambda m, f: AdapterSet(keras.layers.Dense(2)), TypeError, "Received"),
        ("add name=5", lambda m, f: adapter_set(m, f).add(5), ValueError, "name=5"),
        ("add name=''", lambda m, f: adapter_set(m, f).add(""), ValueError, "name=''"),
        ("add twice", lambda m, f: adapter_set(m, f).add("a"), ValueError, "already in this set"),
        ("add a misfit", lambda m, f: adapter_set(m, f).add("b", f["other_hidden"]), ValueError,
         "hidden_dim"),
        ("add a corrupt file", lambda m, f: adapter_set(m, f).add("b", f["corrupt.npz"]),
         ValueError, "corrupt.npz"),
        ("activate unknown", lambda m, f: adapter_set(m, f).activate("c"), KeyError, "Known"),
        ("save unknown", lambda m, f: adapter_set(m, f).save("c", f["folder"] + "/c"), KeyError,
         "No adapter named 'c'"),
        ("save to a missing folder", lambda m, f: adapter_set(m, f).save("a", "/no/such/x"),
         FileNotFoundError, "no folder"),
        ("remove unknown", lambda m, f: adapter_set(m, f).remove("c"), KeyError, "Known"),
    ):  # fmt: skip
        add("AdapterSet", case, call, error, match, t)

    for case, value in (("None", None), ("a string", "model"), ("an array", np.zeros(3))):
        add(
            "parameter_report",
            case,
            lambda m, f, v=value: parameter_report(v),
            TypeError,
            "for model",
        )
    for case, args, match in (
        ("trainable=-1", (-1, 3), "trainable=-1"),
        ("trainable=2.5", (2.5, 3), "trainable=2.5"),
        ("total=True", (1, True), "total=True"),
        ("trainable > total", (4, 3), "trainable <= total"),
    ):
        add("ParameterReport", case, lambda m, f, a=args: ParameterReport(*a), ValueError, match)

    for case, units, match in (
        ("units=0", 0, "units=0"),
        ("units=-2", -2, "units=-2"),
        ("units=2.5", 2.5, "Expected an integer for units"),
        ("units=True", True, "Expected an integer for units"),
        ("units='8'", "8", "Expected an integer for units"),
    ):
        add("AddFFN", case, lambda m, f, u=units: AddFFN(u), ValueError, match)
    add("AddFFN", "activation", lambda m, f: AddFFN(4, activation="nope"), ValueError, "nope")

    encoder = dict(length=3, hidden_dim=16, num_layers=2, hidden_units=8)
    kv = dict(length=3, num_heads=2, head_dim=8, reparameterize=True, hidden_units=8)
    for case, kwargs, match in (
        ("length=-1", dict(kv, length=-1), "length=-1"),
        ("length=2.5", dict(kv, length=2.5), "Expected an integer for length"),
        ("num_heads=0", dict(kv, num_heads=0), "num_heads=0"),
        ("head_dim=1.5", dict(kv, head_dim=1.5), "Expected an integer for head_dim"),
        ("dropout=1", dict(kv, dropout=1), "dropout=1.0"),
        ("reparameterize=0", dict(kv, reparameterize=0), "reparameterize=0"),
        ("hidden_units=0", dict(kv, hidden_units=0), "hidden_units=0"),
        ("encoder='mlp'", dict(kv, encoder="mlp"), "PrefixEncoder for encoder"),
        ("encoder of another width", dict(kv, head_dim=4, encoder=encoder), "does not fit"),
        ("layer_index=2", dict(kv, encoder=encoder, layer_index=2), "layer_index=2"),
        ("layer_index=1 alone", dict(kv, layer_index=1), "layer_index=1"),
        ("encoder without MLP", dict(kv, reparameterize=False, encoder=encoder), "only used"),
    ):
        add(
            "KeyValuePrefix",
            case,
            lambda m, f, kw=kwargs: KeyValuePrefix(**_with_encoder(kw)),
            ValueError,
            match,
        )
    for case, kwargs, match in (
        ("length=-1", dict(encoder, length=-1), "length=-1"),
        ("hidden_dim=0", dict(encoder, hidden_dim=0), "hidden_dim=0"),
        ("num_layers=0", dict(encoder, num_layers=0), "num_layers=0"),
        ("num_layers=2.5", dict(encoder, num_layers=2.5), "Expected an integer for num_layers"),
        ("hidden_units=True", dict(encoder, hidden_units=True), "hidden_units=True"),
    ):
        add("PrefixEncoder", case, lambda m, f, kw=kwargs: PrefixEncoder(**kw), ValueError, match)
    for case, kwargs, match in (
        ("num_layers=0", dict(num_layers=0), "num_layers=0"),
        ("length=2.5", dict(length=2.5), "Expected an integer for length"),
        ("dropout=-1", dict(dropout=-1), "dropout=-1"),
        ("reparameterize='no'", dict(reparameterize="no"), "reparameterize='no'"),
    ):
        base = dict(length=3, num_layers=2, num_heads=2, head_dim=8)
        add(
            "key_value_prefixes",
            case,
            lambda m, f, kw=kwargs, b=base: key_value_prefixes(**{**b, **kw}),
            ValueError,
            match,
        )
    return cases


def _with_encoder(kwargs):
    kwargs = dict(kwargs)
    if isinstance(kwargs.get("encoder"), dict):
        kwargs["encoder"] = PrefixEncoder(**kwargs["encoder"])
    return kwargs


CASES = _cases()


@pytest.fixture(scope="module")
def models(plain, tuned, ma_tuned, merged):
    prefixed, prefixed_backbone = _classifier(seed=4)
    prefixed_backbone.enable_prefix_tuning(length=2)
    hub = keras_hub.models.BertBackbone(**HUB_SIZES)
    first = TransformerBackbone(**tiny_backbone_kwargs(), name="first")
    second = TransformerBackbone(**tiny_backbone_kwargs(), name="second")
    inputs = first.input
    pooled = [b(inputs)["pooled_output"] for b in (first, second)]
    two = keras.Model(inputs, keras.layers.Concatenate()(pooled))
    first.enable_fl_tuning(units=2)
    second.enable_fl_tuning(units=2)
    return {
        "plain": plain,
        "tuned": tuned,
        "ma": ma_tuned,
        "merged": merged,
        "prefixed": prefixed,
        "hub": hub,
        "two": two,
    }


@pytest.mark.parametrize(
    "entry, call, error, match, model",
    [pytest.param(*case[:1], *case[2:], id=f"{case[0]}: {case[1]}") for case in CASES],
)
def test_bad_input_is_refused_clearly_and_changes_nothing(
    entry, call, error, match, model, models, adapter_files
):
    os.makedirs(adapter_files["folder"] + "/dir.npz", exist_ok=True)
    target = models[model]
    before = snapshot(target) if model != "hub" else None
    hub_weights = [np.array(w) for w in target.get_weights()] if model == "hub" else None
    files_before = sorted(os.listdir(adapter_files["folder"]))
    with pytest.raises(error, match=match):
        call(models, adapter_files)
    if model == "hub":
        for new, old in zip(target.get_weights(), hub_weights):
            np.testing.assert_array_equal(new, old)
    else:
        assert_unchanged(target, before)
    # Nothing written next to the adapters (no partial or temporary files).
    assert sorted(os.listdir(adapter_files["folder"])) == files_before


def test_every_entry_point_is_tried():
    counts = collections.Counter(case[0] for case in CASES)
    assert counts == {
        "enable_fl_tuning": 20,
        "enable_prefix_tuning": 17,
        "merge_fl": 8,
        "unmerge_fl": 10,
        "add_ffn_parameter_count": 4,
        "save_adapter": 7,
        "load_adapter": 27,
        "read_adapter": 3,
        "AdapterSet": 10,
        "parameter_report": 3,
        "ParameterReport": 4,
        "AddFFN": 6,
        "KeyValuePrefix": 12,
        "PrefixEncoder": 5,
        "key_value_prefixes": 4,
    }


def test_a_refused_enable_fl_tuning_leaves_the_model_as_it_was_and_a_retry_works():
    model, backbone = _classifier()
    before = snapshot(model)
    # The call of the report: addFFN attached, then attention_units refused.
    with pytest.raises(ValueError, match="attention_units=-1"):
        backbone.enable_fl_tuning(units=4, attention_units=-1)
    assert_unchanged(model, before)
    backbone.enable_fl_tuning(units=np.int64(4), layers=np.array([1]))
    assert backbone.add_ffn == {"units": 4, "layers": [1]}
    assert type(backbone.add_ffn["units"]) is int
    assert [b.feed_forward_branch is not None for b in backbone.transformer_layers] == [
        False,
        True,
    ]
    assert parameter_report(backbone).trainable == add_ffn_parameter_count(32, 4, 1)
    json.dumps(backbone.get_config())  # numpy values did not leak into the config


def test_a_failure_while_attaching_is_rolled_back(monkeypatch):
    model, backbone = _classifier()
    before = snapshot(model)

    def fail(*args, **kwargs):
        raise RuntimeError("attaching failed")

    # The addFFN is attached... then the second step fails.
    monkeypatch.setattr(backbone, "attach_attention_units", fail)
    with pytest.raises(RuntimeError, match="attaching failed"):
        backbone.enable_fl_tuning(units=4, attention_units=2)
    assert_unchanged(model, before)
    real_freeze = backbone.freeze_base

    def freeze_then_fail(*args, **kwargs):
        real_freeze(*args, **kwargs)
        fail()

    monkeypatch.setattr(backbone, "freeze_base", freeze_then_fail)
    with pytest.raises(RuntimeError, match="attaching failed"):
        backbone.enable_prefix_tuning(length=2)
    assert_unchanged(model, before)
    monkeypatch.undo()
    backbone.enable_fl_tuning(units=4, attention_units=2)
    backbone.enable_prefix_tuning(length=2)
    assert backbone.add_ffn and backbone.add_attention_units and backbone.key_value_prefix
    assert backbone.embeddings.trainable is False


def test_enable_prefix_tuning_accepts_numpy_numbers_and_a_refused_call_can_be_retried(features):
    model, backbone = _classifier()
    before = snapshot(model)
    with pytest.raises(ValueError, match="dropout"):
        backbone.enable_prefix_tuning(length=2, dropout=1.5)
    assert_unchanged(model, before)
    backbone.enable_prefix_tuning(
        length=np.int64(2),
        dropout=np.float32(0.25),
        reparameterize=np.bool_(False),
        hidden_units=np.int32(8),
        layers=[np.int64(0)],
    )
    assert backbone.key_value_prefix == {
        "length": 2,
        "layers": [0],
        "dropout": 0.25,
        "reparameterize": False,
        "hidden_units": 8,
    }
    json.dumps(backbone.get_config())
    assert parameter_report(backbone).trainable == 2 * 2 * 32


@pytest.fixture
def fresh_and_expected(tuned, adapter_files):
    """A fresh model with the tuned model's base weights, and the tuned outputs."""
    features = random_features()
    model, backbone = _classifier(seed=2)
    model.get_layer("head").set_weights(
        [np.zeros(w.shape, "float32") for w in model.get_layer("head").weights]
    )
    return model, backbone, np.asarray(tuned(features)), features


@pytest.mark.parametrize(
    "bad",
    ["corrupt.npz", "truncated.npz", "wrong_shapes.npz", "wrong_names.npz", "other_hidden",
     "other_head", "missing.npz"],
)  # fmt: skip
def test_a_refused_adapter_leaves_a_fresh_model_unchanged_and_a_retry_loads(
    bad, fresh_and_expected, adapter_files
):
    model, backbone, expected, features = fresh_and_expected
    before = snapshot(model)
    with pytest.raises((ValueError, FileNotFoundError)):
        load_adapter(model, adapter_files.get(bad, adapter_files["folder"] + "/" + bad))
    assert_unchanged(model, before)
    assert backbone.add_ffn is None and backbone.frozen_base is False
    assert load_adapter(model, adapter_files["good"]) == "good"
    np.testing.assert_allclose(np.asarray(model(features)), expected, atol=1e-6)
    assert backbone.frozen_base is True


def test_a_refused_adapter_leaves_a_tuned_model_unchanged(tuned, adapter_files):
    model, backbone = _classifier(seed=2)
    backbone.enable_fl_tuning(units=UNITS)
    randomize_weights(model, seed=11)  # branches and head: differ from the file
    before = snapshot(model)
    for bad in ("wrong_shapes.npz", "other_head", "corrupt.npz"):
        with pytest.raises(ValueError):
            load_adapter(model, adapter_files[bad])
        assert_unchanged(model, before)
    # An assignment that fails half-way is undone too.
    variables = model.trainable_weights

    class Flaky:
        calls = 0

    original = type(variables[0]).assign

    def assign(self, value):
        Flaky.calls += 1
        if Flaky.calls == 3:
            raise RuntimeError("device lost")
        return original(self, value)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(variables[0]), "assign", assign)
        with pytest.raises(RuntimeError, match="device lost"):
            load_adapter(model, adapter_files["good"])
    assert_unchanged(model, before)
    load_adapter(model, adapter_files["good"])
    features = random_features()
    np.testing.assert_allclose(np.asarray(model(features)), np.asarray(tuned(features)), atol=1e-6)


def test_version_1_files_still_load(fresh_and_expected, adapter_files):
    model, _, expected, features = fresh_and_expected
    load_adapter(model, adapter_files["version1.npz"])
    np.testing.assert_allclose(np.asarray(model(features)), expected, atol=1e-6)


def test_save_adapter_replaces_a_file_only_when_the_new_one_is_complete(
    tuned, tmp_path, monkeypatch
):
    path = save_adapter(tuned, tmp_path / "adapter", name="first")
    with open(path, "rb") as file:
        first = file.read()

    def broken_savez(file, **arrays):
        file.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(OSError, match="No space left"):
        save_adapter(tuned, path, name="second")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["adapter.npz"]  # no temporary file left behind
    with open(path, "rb") as file:
        assert file.read() == first
    assert read_adapter(path)[0]["name"] == "first"
    save_adapter(tuned, path, name="second")
    assert read_adapter(tmp_path / "adapter")[0]["name"] == "second"


def test_adapter_set_switches_are_all_or_nothing(tuned, adapter_files, tmp_path):
    model, backbone = _classifier(seed=2)
    adapters = AdapterSet(model)
    adapters.add("good", adapter_files["good"])
    adapters.add("bad", adapter_files["wrong_shapes.npz"])  # fits the config; shapes differ
    before = snapshot(model)
    with pytest.raises(ValueError, match="v0 has shape"):
        adapters.activate("bad")
    assert_unchanged(model, before)
    assert adapters.active is None
    adapters.activate("good")
    features = random_features()
    np.testing.assert_allclose(np.asarray(model(features)), np.asarray(tuned(features)), atol=1e-6)
    adapters.remove("bad")
    assert adapters.names == ["good"]
    saved = adapters.save("good", tmp_path / "copy")
    assert read_adapter(saved)[0]["name"] == "good"


def test_nothing_is_printed_and_the_report_is_logged(capsys, caplog):
    _, backbone = _classifier()
    with caplog.at_level(logging.INFO, logger="keras_masking"):
        backbone.enable_fl_tuning(units=UNITS)
        backbone.enable_prefix_tuning(length=2)
    assert capsys.readouterr().out == ""
    messages = [r.getMessage() for r in caplog.records if "-tuning" in r.getMessage()]
    fl_count = add_ffn_parameter_count(32, UNITS, 2)
    head = 0  # the log counts the backbone's parameters
    assert f"FL-tuning: {UNITS} units per FFN" in messages[0]
    assert f"trainable parameters: {fl_count + head:,} of" in messages[0]
    prefix_count = fl_count + head + 2 * 2 * 2 * 32
    assert f"P-tuning v2: prefix length 2; trainable parameters: {prefix_count:,}" in messages[1]


def test_prefix_encoder_round_trips_and_computes_in_the_policy_dtype():
    encoder = PrefixEncoder(length=3, hidden_dim=16, num_layers=2, hidden_units=8)
    randomize_weights(encoder, seed=12, scale=0.3)
    table, w1, b1, w2, b2 = encoder.get_weights()
    expected = np.tanh(table @ w1 + b1) @ w2 + b2
    np.testing.assert_allclose(np.asarray(encoder()), expected, atol=1e-5)
    np.testing.assert_allclose(np.asarray(encoder(layer_index=1)), expected[:, 32:], atol=1e-5)
    np.testing.assert_allclose(np.asarray(encoder(training=True)), expected, atol=1e-5)
    config = encoder.get_config()
    assert {k: config[k] for k in ("length", "hidden_dim", "num_layers", "hidden_units")} == {
        "length": 3,
        "hidden_dim": 16,
        "num_layers": 2,
        "hidden_units": 8,
    }
    restored = PrefixEncoder.from_config(config)
    restored.set_weights(encoder.get_weights())
    np.testing.assert_allclose(np.asarray(restored()), expected, atol=1e-6)
    # A standalone reparameterised prefix serialises its own encoder.
    prefix = KeyValuePrefix(3, num_heads=2, head_dim=8, reparameterize=True, hidden_units=8)
    clone = KeyValuePrefix.from_config(prefix.get_config())
    assert isinstance(clone.encoder, PrefixEncoder) and clone.encoder is not prefix.encoder
    assert clone.encoder.num_layers == 1 and clone.layer_index == 0
    half = PrefixEncoder(3, 16, 2, 8, dtype="mixed_bfloat16")
    assert half.embeddings.dtype == "float32"
    assert keras.backend.standardize_dtype(half().dtype) == "bfloat16"
