"""StateExpansion: ExLM's [MASK] (and [CLS]/[SEP]) expansion into k states."""

import numpy as np
import pytest

from keras_masking.layers import StateExpansion
from tests.models.exlm_testing import CLS
from tests.models.exlm_testing import IDS
from tests.models.exlm_testing import MASK
from tests.models.exlm_testing import ONES
from tests.models.exlm_testing import SEP
from tests.models.exlm_testing import make_expansion
from tests.models.exlm_testing import padding_layouts
from tests.models.exlm_testing import reference_expansion
from tests.models.exlm_testing import refused_without_change
from tests.models.exlm_testing import to_numpy


def test_expansion_reproduces_the_worked_example():
    expand = StateExpansion(
        k=4, mask_token_id=MASK, expand_token_ids=(CLS, SEP), max_expanded_tokens=4
    )
    ids = np.array([[CLS, 7, MASK, MASK, 8, SEP, 0, 0]], "int32")
    out = expand(ids, (ids > 0).astype("int32"))
    assert to_numpy(out["token_ids"]).shape == (1, 8 + 3 * 4)
    pos1 = "".join(str(v) for v in to_numpy(out["position_ids"])[0, :18, 0])
    pos2 = "".join(str(v) for v in to_numpy(out["position_ids"])[0, :18, 1])
    assert pos1 == "000012222333345555"  # 0000 1 2222 3333 4 5555
    assert pos2 == "123401234123401234"  # 1234 0 1234 1234 0 1234
    assert (
        to_numpy(out["token_ids"])[0, :18].tolist()
        == [CLS] * 4 + [7] + [MASK] * 8 + [8] + [SEP] * 4
    )
    assert to_numpy(out["padding_mask"])[0].tolist() == [1] * 18 + [0] * 2
    assert not to_numpy(out["overflow"])[0]
    # Too many expanded tokens for the static length: cut and flagged.
    tight = StateExpansion(
        k=4, mask_token_id=MASK, expand_token_ids=(CLS, SEP), max_expanded_tokens=2
    )
    assert to_numpy(tight(ids, (ids > 0).astype("int32"))["overflow"])[0]
    # Neither size given: room for every token, so nothing can overflow.
    assert StateExpansion(k=4, mask_token_id=MASK).output_length(8) == 32


def test_state_expansion_is_the_same_for_every_padding_layout():
    expand = StateExpansion(k=4, mask_token_id=MASK, expand_token_ids=(CLS, SEP))
    # The example, left-padded: [PAD, PAD, CLS, 7, MASK, SEP].
    out = expand(np.array([[0, 0, CLS, 7, MASK, SEP]]), np.array([[0, 0, 1, 1, 1, 1]]))
    positions = to_numpy(out["position_ids"])[0, :13]
    assert "".join(str(v) for v in positions[:, 0]) == "0000122223333"
    assert "".join(str(v) for v in positions[:, 1]) == "1234012341234"
    assert to_numpy(out["token_ids"])[0, :13].tolist() == [CLS] * 4 + [7] + [MASK] * 4 + [SEP] * 4
    assert to_numpy(out["source_index"])[0, :13].tolist() == [2] * 4 + [3] + [4] * 4 + [5] * 4
    layouts = padding_layouts([[CLS, 7, MASK, 8, SEP], [CLS, 9, SEP, 10, 11, SEP]], 8)
    outputs = {}
    for name, ids in layouts.items():
        mask = (ids > 0).astype("int32")
        outputs[name] = {key: to_numpy(v) for key, v in expand(ids, mask).items()}
        for b in range(2):
            reference = reference_expansion(ids[b], mask[b], np.zeros(8, bool), 4, 32)
            for key in ("token_ids", "position_ids", "padding_mask"):
                np.testing.assert_array_equal(outputs[name][key][b], reference[key])
            used = reference["padding_mask"].sum()
            source = outputs[name]["source_index"][b, :used]
            np.testing.assert_array_equal(ids[b][source], reference["token_ids"][:used])
            for j, slot in reference["first_slot"].items():
                assert outputs[name]["first_slot"][b, j] == slot
    for key in ("token_ids", "position_ids", "padding_mask", "expanded_mask", "overflow"):
        np.testing.assert_array_equal(outputs["left"][key], outputs["right"][key])
        np.testing.assert_array_equal(outputs["inside"][key], outputs["right"][key])


def test_numpy_numbers_are_accepted_where_python_numbers_are():
    expansion = StateExpansion(
        k=np.int64(2), mask_token_id=np.int32(MASK), mask_rate=np.float32(0.5)
    )
    assert (expansion.k, expansion.mask_rate) == (2, 0.5)


BAD_ARGUMENTS = [
    (lambda: make_expansion(k=2.5), r"integer for k\. Received: k=2\.5"),
    (lambda: make_expansion(k=0), r"integer >= 1 for k\. Received: k=0"),
    (lambda: make_expansion(k=True), r"integer for k\. Received: k=True"),
    (lambda: make_expansion(mask_token_id=-1), r"mask_token_id\. Received: mask_token_id=-1"),
    (lambda: make_expansion(mask_token_id="103"), r"integer for mask_token_id"),
    (lambda: make_expansion(expand_token_ids=101), r"list of integers for expand_token_ids"),
    (lambda: make_expansion(expand_token_ids=(1, 2.5)), r"expand_token_ids=\(1, 2\.5\)"),
    (lambda: make_expansion(expand_token_ids=(1, -2)), r"entry of expand_token_ids in \[0, inf\)"),
    (lambda: make_expansion(max_expanded_tokens=-1), r"max_expanded_tokens=-1"),
    (lambda: make_expansion(max_expanded_tokens=1.5), r"integer for max_expanded_tokens"),
    (lambda: make_expansion(mask_rate=1.5), r"mask_rate in \(0\.0, 1\.0\]\. Received"),
    (lambda: make_expansion(mask_rate=0), r"mask_rate in \(0\.0, 1\.0\]"),
    (lambda: make_expansion(mask_rate=0.15, max_expanded_tokens=3), r"at most one of"),
]


@pytest.mark.parametrize("make, match", BAD_ARGUMENTS)
def test_bad_arguments_are_refused_with_a_clear_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


BAD_CALLS = [
    (
        lambda e: e(IDS.astype("float32"), ONES),
        r"Expected integer token_ids\. Received: token_ids of dtype float32",
    ),
    (
        lambda e: e(IDS.astype(bool), ONES),
        r"Expected integer token_ids\. Received: token_ids of dtype bool",
    ),
    (lambda e: e(IDS[0], ONES[0]), r"token_ids of shape \(batch, sequence\)"),
    (lambda e: e(IDS, ONES[:, :3]), r"padding_mask of the shape of token_ids"),
    (
        lambda e: e(IDS, ONES * 2),
        r"padding_mask of 0s and 1s\. Received: padding_mask with the values \[2\]",
    ),
    (lambda e: e(IDS, ONES, expand_mask=ONES[:, :2]), r"expand_mask of the shape"),
]


@pytest.mark.parametrize("call, match", BAD_CALLS)
def test_bad_call_inputs_are_refused_before_anything_changes(call, match):
    instance = make_expansion(max_expanded_tokens=2)
    refused_without_change(instance, call, match)
