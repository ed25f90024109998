"""keras_masking.clue.add_character_noise: the noised dev of robustness checks."""

import dataclasses

import numpy as np
import pytest

from keras_masking.clue import add_character_noise
from keras_masking.clue.examples import ChoiceExample
from keras_masking.clue.examples import TextExample

EXAMPLES = [
    TextExample(0, "这家店的菜很好吃，服务也不错。", None, "Positive"),
    TextExample("a", "物流太慢了!!等了10天", "快递三天就到了", "0"),
    TextExample(2, "他_把球_给了[小明]。", None, "true"),  # CLUEWSC's marking
]


def _long_examples(count=200):
    rng = np.random.default_rng(5)
    characters = [chr(code) for code in range(0x4E00, 0x4E00 + 300)]
    return [
        TextExample(index, "".join(rng.choice(characters, 40)), None, "Positive")
        for index in range(count)
    ]


def test_no_noise_returns_the_examples_unchanged():
    assert add_character_noise(EXAMPLES, 0.0) == EXAMPLES
    assert add_character_noise(iter(EXAMPLES), 0.0) == EXAMPLES


def test_every_letter_and_digit_is_replaced_at_rate_one_and_nothing_else_moves():
    noised = add_character_noise(EXAMPLES, 1.0, seed=3)
    alphabet = {
        character
        for example in EXAMPLES
        for text in (example.text_a, example.text_b or "")
        for character in text
        if character.isalnum()
    }
    for before, after in zip(EXAMPLES, noised):
        assert (after.id, after.label, after.source) == (before.id, before.label, before.source)
        assert (after.text_b is None) == (before.text_b is None)
        for old, new in zip(
            [before.text_a, before.text_b or ""], [after.text_a, after.text_b or ""]
        ):
            assert len(new) == len(old)
            for a, b in zip(old, new):
                if a.isalnum():
                    assert b != a and b in alphabet  # another of the texts' own characters
                else:
                    assert b == a  # punctuation, spaces and CLUEWSC's markers stay
    assert noised[2].text_a[1] == "_" and noised[2].text_a[7] == "["


def test_the_share_replaced_is_the_rate_and_the_seed_fixes_the_draw():
    examples = _long_examples()
    noised = add_character_noise(examples, 0.1, seed=0)
    changed = sum(
        a != b
        for before, after in zip(examples, noised)
        for a, b in zip(before.text_a, after.text_a)
    )
    total = sum(len(example.text_a) for example in examples)  # 8,000 characters
    # Binomial(8000, 0.1): sd 27 characters; 4.5 sd either side.
    assert abs(changed - 0.1 * total) < 120
    assert add_character_noise(examples, 0.1, seed=0) == noised
    assert add_character_noise(examples, 0.1, seed=1) != noised


def test_replacements_are_uniform_over_the_other_characters():
    examples = [TextExample(0, "ab" * 3000, None, "x"), TextExample(1, "c", None, "x")]
    noised = add_character_noise(examples, 1.0, seed=0)[0].text_a
    # Each "a" becomes "b" or "c" (each half the time), never "a".
    counts = {character: noised[0::2].count(character) for character in "abc"}
    assert counts["a"] == 0
    assert abs(counts["b"] - 1500) < 4.5 * np.sqrt(3000 * 0.25)


def test_the_records_stay_frozen_dataclasses_with_their_source():
    example = dataclasses.replace(EXAMPLES[0], source="dev.json:1")
    (noised,) = add_character_noise([example, EXAMPLES[1]], 0.5)[:1]
    assert noised.source == "dev.json:1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        noised.text_a = ""


@pytest.mark.parametrize(
    "examples, rate, seed, message",
    [
        (EXAMPLES, -0.1, 0, r"rate in \[0.0, 1.0\]"),
        (EXAMPLES, 1.5, 0, r"rate in \[0.0, 1.0\]"),
        (EXAMPLES, float("nan"), 0, "Expected a number for rate"),
        (EXAMPLES, 0.1, -1, "seed"),
        (
            [ChoiceExample(0, "男：你好。", "他说了什么？", ("你好",), 0)],
            0.1,
            0,
            "ChoiceExample at position 0",
        ),
        ([TextExample(0, "aaa。", None, "x")], 0.1, 0, "at least 2 distinct letters or digits"),
    ],
)
def test_bad_arguments_are_refused(examples, rate, seed, message):
    with pytest.raises(ValueError, match=message):
        add_character_noise(examples, rate, seed=seed)
