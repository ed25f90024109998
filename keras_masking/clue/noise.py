"""Character noise on a split's texts: how well a model holds up on typo-ridden input.

`add_character_noise` replaces a share of the characters of text
classification and sentence-pair examples; `finetune(dev_noise=...)` and
`compare(noise=...)` score a noised copy of dev beside dev itself.
"""

import dataclasses

import numpy as np

from keras_masking.clue.examples import TextExample
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int

# The seed of the noised dev that `finetune` scores: one noised dev for every
# run and seed, so that runs compare on the same texts.
DEV_NOISE_SEED = 0


def check_noise_rate(name, rate, task):
    """``rate`` as a float in [0, 1], refused above 0 for a task that is not text classification.

    Args:
        name: the argument's name in the message (``"noise"``, ``"dev_noise"``).
        rate: the share of characters to replace.
        task: the `ClueTask`.

    Returns:
        The rate, a float.

    Raises:
        ValueError: a rate out of range, or noise for another task kind.

    Example:
    >>> from keras_masking.clue.tasks import get_task
    >>> check_noise_rate("noise", 0.1, get_task("tnews"))
    0.1
    """
    rate = check_float(name, rate, 0.0, 1.0)
    if rate and task.kind != "classification":
        raise ValueError(
            f"{name} applies to text classification and sentence-pair tasks; {task.name} is a "
            f"{task.kind} task. Received: {name}={rate}."
        )
    return rate


def add_character_noise(examples, rate, seed=0):
    """Replaces characters of each text at random, for a robustness check.

    Every letter or digit of ``text_a`` and ``text_b`` (``str.isalnum``:
    every Chinese character too) is, independently with probability
    ``rate``, replaced by another such character drawn uniformly from the
    ones these examples' texts use (never by itself). Spaces, punctuation and
    CLUEWSC's span markers are kept, and so are the texts' lengths. The
    result depends on the examples (in order), ``rate`` and ``seed`` only.

    Args:
        examples: `TextExample` records (the classification and
            sentence-pair tasks), e.g. `read_split(...).examples`.
        rate: float in [0, 1], the share of characters replaced.
        seed: int >= 0, the seed of the draws.

    Returns:
        A list of `TextExample`, the same ids, labels and order, the texts
        noised.

    Raises:
        ValueError: ``rate`` or ``seed`` out of range, a record that is not
            a `TextExample`, or ``rate > 0`` with texts that use fewer than 2
            distinct letters or digits (nothing to replace with).

    Example:
    >>> from keras_masking.clue.examples import TextExample
    >>> examples = [TextExample(0, "这家店的菜很好吃", None, "Positive"),
    ...             TextExample(1, "服务太慢了，不会再来", None, "Negative")]
    >>> noised = add_character_noise(examples, 0.5, seed=0)
    >>> [len(example.text_a) for example in noised] == [8, 10], noised[1].text_a[5]
    (True, '，')
    >>> add_character_noise(examples, 0.0) == examples
    True
    """
    rate = check_float("rate", rate, 0.0, 1.0)
    seed = check_int("seed", seed, minimum=0)
    examples = list(examples)
    for index, example in enumerate(examples):
        if not isinstance(example, TextExample):
            raise ValueError(
                "Character noise applies to text classification and sentence-pair examples "
                f"(TextExample). Received: {type(example).__name__} at position {index}."
            )
    if rate == 0.0:
        return examples
    alphabet = sorted({
        character
        for example in examples
        for text in (example.text_a, example.text_b or "")
        for character in text
        if character.isalnum()
    })  # fmt: skip
    if len(alphabet) < 2:
        raise ValueError(
            f"Character noise needs texts with at least 2 distinct letters or digits to draw "
            f"replacements from; these {len(examples)} examples use {len(alphabet)}."
        )
    position = {character: index for index, character in enumerate(alphabet)}
    rng = np.random.default_rng(seed)

    def noised(text):
        if text is None:
            return None
        hit = rng.random(len(text)) < rate
        draws = rng.integers(0, len(alphabet) - 1, size=len(text))
        characters = list(text)
        for index, character in enumerate(characters):
            if hit[index] and character.isalnum():
                draw = int(draws[index])
                # Skip the character itself: draw among the other len - 1.
                characters[index] = alphabet[draw + (draw >= position[character])]
        return "".join(characters)

    return [
        dataclasses.replace(example, text_a=noised(example.text_a), text_b=noised(example.text_b))
        for example in examples
    ]
