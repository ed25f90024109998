"""The XLA CPU fusion-emitter workaround for token-dropping steps."""

import os
import warnings

import keras
import pytest

import keras_masking
from keras_masking.utils import xla_cpu
from tests.testing import tiny_backbone_kwargs


def test_disable_fusion_emitters_appends_the_flag_once(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/nowhere")
    assert not keras_masking.utils.xla_cpu_fusion_emitters_disabled()
    value = keras_masking.utils.disable_xla_cpu_fusion_emitters()
    assert value == "--xla_dump_to=/tmp/nowhere --xla_cpu_use_fusion_emitters=false"
    assert keras_masking.utils.disable_xla_cpu_fusion_emitters() == value
    assert os.environ["XLA_FLAGS"] == value
    assert keras_masking.utils.xla_cpu_fusion_emitters_disabled()


def test_enable_drop_token_warns_only_where_the_slowdown_applies(monkeypatch):
    def enable_drop_token(rate, **kwargs):
        backbone = keras_masking.models.TransformerBackbone(**tiny_backbone_kwargs())
        backbone.enable_drop_token(rate, **kwargs)

    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setattr(xla_cpu, "_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        enable_drop_token(0.0)
        enable_drop_token(0.2, mode="attention")
    assert not [w for w in caught if "fusion emitters" in str(w.message)]
    if keras.config.backend() == "tensorflow":
        with pytest.warns(UserWarning, match="disable_xla_cpu_fusion_emitters"):
            enable_drop_token(0.2)
    monkeypatch.setattr(xla_cpu, "_warned", False)
    monkeypatch.setenv("XLA_FLAGS", xla_cpu.FUSION_EMITTERS_OFF_FLAG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        enable_drop_token(0.2)
    assert not [w for w in caught if "fusion emitters" in str(w.message)]
