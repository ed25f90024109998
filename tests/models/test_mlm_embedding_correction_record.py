"""The MLM embedding correction record: its config, its file, and loading it."""

import json
import re

import numpy as np
import pytest

import keras_masking
from keras_masking.models import MLMEmbeddingCorrectionRecord
from keras_masking.models import TransformerMaskedLM
from keras_masking.models.mlm_embedding_correction_record import RECORD_FILE
from keras_masking.models.mlm_embedding_correction_record import load_folder_record
from keras_masking.models.mlm_embedding_correction_record import mark_loaded_record
from keras_masking.models.mlm_embedding_correction_record import read_correction_record
from keras_masking.models.mlm_embedding_correction_record import write_correction_record
from tests.methods.mlm_correction_helpers import MASK
from tests.methods.mlm_correction_helpers import tiny_ours


@pytest.fixture(scope="module")
def record():
    return keras_masking.correct_mlm_embeddings(tiny_ours(), MASK).to_config()


def test_config_round_trip_and_bad_configs(record):
    assert MLMEmbeddingCorrectionRecord.from_config(record).to_config() == record
    with pytest.raises(ValueError, match="Expected a dict for the MLM embedding correction"):
        MLMEmbeddingCorrectionRecord.from_config([1, 2])
    with pytest.raises(ValueError, match=r"missing \['mask_token_id'"):
        MLMEmbeddingCorrectionRecord.from_config({"mask_rate": 0.1})
    with pytest.raises(ValueError, match=r"unknown keys \['source'\]"):
        MLMEmbeddingCorrectionRecord.from_config({**record, "source": "x"})


def test_record_file_written_read_and_removed(tmp_path, record):
    write_correction_record(tmp_path, record, "here")
    assert read_correction_record(tmp_path) == {**record, "source": "here"}
    config = load_folder_record(tmp_path, "words", (64, 32))
    assert config == {**record, "embedding": "words"}
    with pytest.raises(ValueError, match=f"{RECORD_FILE}: the record is for a 64 x 32 table"):
        load_folder_record(tmp_path, "words", (65, 32))
    write_correction_record(tmp_path, None, "here")  # uncorrected files: no stale record
    assert not (tmp_path / RECORD_FILE).exists()
    assert load_folder_record(tmp_path, "words", (64, 32)) is None


def test_bad_record_files_are_named(tmp_path):
    with pytest.raises(TypeError, match=r"Expected a path \(str or os.PathLike\) for folder"):
        read_correction_record(3)
    (tmp_path / RECORD_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / RECORD_FILE)) + ": not a"):
        read_correction_record(tmp_path)
    (tmp_path / RECORD_FILE).write_text(json.dumps({"mask_token_id": 3}))
    with pytest.raises(ValueError, match=r"missing \['mask_rate'"):
        read_correction_record(tmp_path)
    assert read_correction_record(tmp_path / "elsewhere") is None


def test_a_loaded_record_resets_the_tied_head(record):
    masked_lm = TransformerMaskedLM(tiny_ours())
    keras_masking.correct_mlm_embeddings(masked_lm, MASK)  # the head compensates
    head = masked_lm.masked_lm_head
    assert np.abs(np.asarray(head.output_shift)).max() > 0
    mark_loaded_record(masked_lm, record)
    assert masked_lm.backbone.mlm_embedding_correction == record
    assert masked_lm.backbone.token_embedding.mlm_embedding_correction == record
    np.testing.assert_array_equal(np.asarray(head.output_row_scale), 1.0)
    np.testing.assert_array_equal(np.asarray(head.output_row_shift_weight), 0.0)
    np.testing.assert_array_equal(np.asarray(head.output_shift), 0.0)
    mark_loaded_record(masked_lm, None)
    assert masked_lm.backbone.mlm_embedding_correction is None
