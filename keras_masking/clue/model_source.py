"""Where a fine-tuning run's encoder and vocabulary come from: a Google-layout
TF checkpoint (``bert_config.json`` and ``vocab.txt`` beside it) or a preset
folder (this package's, keras-hub's or a Hugging Face BERT folder)."""

import dataclasses
import json
import os
import pathlib

from keras_masking.utils.arguments import check_choice
from keras_masking.utils.files import file_sha256

VOCABULARY_NAMES = (
    "vocab.txt",
    os.path.join("assets", "tokenizer", "vocabulary.txt"),
    # A UnigramTokenizer's model (multilingual-e5 presets, `convert_multilingual_e5`).
    os.path.join("assets", "tokenizer", "unigram_model.json"),
)
# What a unigram tokenizer holds for BERT's special tokens.
UNIGRAM_SPECIALS = {
    "[CLS]": "<s>",
    "[SEP]": "</s>",
    "[PAD]": "<pad>",
    "[UNK]": "<unk>",
    "[MASK]": "<mask>",
}
FAMILIES = ("bert", "roberta", "roformer", "nezha")
# Tokens every task encoding uses.
REQUIRED_TOKENS = ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A checkpoint or a preset folder, with its config and vocabulary files.

    Args:
        checkpoint: TF checkpoint prefix, folder or ``.index`` file; or None.
        preset: preset folder; or None. Exactly one of the two.
        model: the checkpoint's family, ``"bert"``, ``"roberta"``,
            ``"roformer"`` or ``"nezha"`` (checkpoints only).
        config: ``bert_config.json``; default: next to the checkpoint.
        vocabulary: ``vocab.txt``; default: next to the checkpoint, or the
            preset's own (``vocab.txt`` or ``assets/tokenizer/vocabulary.txt``).
        Paths may be str or path-like.

    Example:
    ```python
    source = ModelSource(checkpoint="chinese_L-12_H-768_A-12/bert_model.ckpt")
    paths = source.check()  # names any missing file, reads no weights
    backbone, tokenizer = source.load()  # the vocabulary is checked against the model
    ```
    """

    checkpoint: str | None = None
    preset: str | None = None
    model: str = "bert"
    config: str | None = None
    vocabulary: str | None = None

    def __post_init__(self):
        if (self.checkpoint is None) == (self.preset is None):
            raise ValueError(
                "Expected exactly one of checkpoint and preset. Received: "
                f"checkpoint={self.checkpoint!r}, preset={self.preset!r}."
            )
        check_choice("model", self.model, FAMILIES)
        for name in ("checkpoint", "preset", "config", "vocabulary"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, os.fspath(getattr(self, name)))

    @property
    def folder(self):
        """The folder the model files lie in."""
        path = pathlib.Path(self.checkpoint or self.preset)
        return path if self.preset is not None or path.is_dir() else path.parent

    def config_file(self):
        """The checkpoint's ``bert_config.json`` (None for presets)."""
        if self.preset is not None:
            return None
        if self.config is not None:
            return existing_file(self.config, "--config", "a bert_config.json file")
        return _first_existing(self.folder, ("bert_config.json",), "bert_config.json", "--config")

    def preset_vocabulary(self):
        """The vocabulary file a preset folder carries, or None."""
        return None if self.preset is None else _first_file(self.folder, VOCABULARY_NAMES)

    def vocabulary_file(self):
        """The vocabulary to tokenise with (checked to exist)."""
        if self.vocabulary is not None:
            return existing_file(self.vocabulary, "--vocab", "a vocab.txt file")
        return self.preset_vocabulary() or _first_existing(
            self.folder, VOCABULARY_NAMES, "vocabulary", "--vocab"
        )

    def check(self):
        """Checks every file the source needs exists; reads no weights.

        Returns:
            A dict of the absolute paths (``model``, ``config``, ``vocabulary``).
        """
        if self.checkpoint is not None:
            model_path = checkpoint_prefix(self.checkpoint, "--checkpoint")
        else:
            if not os.path.isdir(self.preset):
                raise FileNotFoundError(f"--preset {self.preset!r}: no such folder.")
            model_path = self.preset
        config = self.config_file()
        return {
            "model": os.path.abspath(model_path),
            "config": None if config is None else os.path.abspath(config),
            "vocabulary": os.path.abspath(self.vocabulary_file()),
        }

    def position_scheme(self):
        """``(position, custom_position_ids)`` of the backbone, read without its weights.

        A checkpoint's family fixes its scheme; a preset of this package says
        it in its config.json (a keras-hub or Hugging Face one is absolute).

        Example:
        ```python
        ModelSource(preset="my_preset").position_scheme()  # ("rotary2d", True)
        ```
        """
        from keras_masking.models.backbone_config import FAMILY_POSITIONS

        if self.checkpoint is not None:
            return FAMILY_POSITIONS[self.model], False
        path = pathlib.Path(self.preset, "config.json")
        try:
            config = json.loads(path.read_text(encoding="utf-8")).get("config", {})
        except (OSError, ValueError, AttributeError):
            return "absolute", False  # the loader names a bad file when it reads it
        if not isinstance(config, dict):
            return "absolute", False
        return config.get("position", "absolute"), bool(config.get("custom_position_ids"))

    def load(self, required_tokens=()):
        """Loads the backbone and a tokenizer that fits it.

        Args:
            required_tokens: tokens the task's encoding needs besides
                `REQUIRED_TOKENS` (CHID's ``[unused1]``).

        Returns:
            ``(backbone, tokenizer)``: a `TransformerBackbone` and a keras-hub
            `BertTokenizer`.

        Raises:
            ValueError: a vocabulary whose size differs from the model's, a
                ``--vocab`` that differs from the preset's own vocabulary, or
                a vocabulary without the special tokens tasks need.
        """
        from keras_masking.data.tokenization import bert_tokenizer
        from keras_masking.data.tokenization import read_vocabulary
        from keras_masking.models import TransformerBackbone
        from keras_masking.models import from_tf_checkpoint

        paths = self.check()
        if paths["vocabulary"].endswith("unigram_model.json"):
            return self._load_unigram(paths, required_tokens)
        tokens = read_vocabulary(paths["vocabulary"])
        own = self.preset_vocabulary()
        if self.vocabulary is not None and own is not None and read_vocabulary(own) != tokens:
            raise ValueError(
                f"--vocab {self.vocabulary!r} differs from the preset's own vocabulary "
                f"{os.fspath(own)!r}; a model is fine-tuned with the vocabulary it was trained "
                "with."
            )
        needed = list(REQUIRED_TOKENS) + [t for t in required_tokens if t not in REQUIRED_TOKENS]
        missing = [token for token in needed if token not in set(tokens)]
        if missing:
            raise ValueError(
                f"The vocabulary {paths['vocabulary']!r} lacks {missing}; this task's encoding "
                f"needs {needed}."
            )
        if self.preset is not None:
            backbone = TransformerBackbone.from_preset(self.preset)
        else:
            backbone = from_tf_checkpoint(paths["config"], paths["model"], model=self.model)
        if len(tokens) != backbone.vocabulary_size:
            raise ValueError(
                f"The vocabulary {paths['vocabulary']!r} has {len(tokens)} tokens but the model "
                f"{backbone.vocabulary_size}; pass the model's own vocab.txt with --vocab."
            )
        return backbone, bert_tokenizer(tokens)

    def _load_unigram(self, paths, required_tokens):
        """A preset whose tokenizer is a `UnigramTokenizer` (multilingual-e5)."""
        from keras_masking.models import TransformerBackbone
        from keras_masking.models import UnigramTokenizer

        if self.vocabulary is not None and os.path.abspath(self.vocabulary) != paths["vocabulary"]:
            raise ValueError(
                f"--vocab {self.vocabulary!r}: this preset tokenises with its own unigram "
                f"model {paths['vocabulary']!r}; leave --vocab out."
            )
        missing = [token for token in required_tokens if token not in UNIGRAM_SPECIALS]
        if missing:
            raise ValueError(
                f"The preset {self.preset!r} tokenises with XLM-R unigram pieces, which have no "
                f"{missing}; this task's encoding needs them. Use a BERT-vocabulary model."
            )
        tokenizer = UnigramTokenizer(paths["vocabulary"])
        backbone = TransformerBackbone.from_preset(self.preset)
        if tokenizer.vocabulary_size() != backbone.vocabulary_size:
            raise ValueError(
                f"The unigram model {paths['vocabulary']!r} gives {tokenizer.vocabulary_size()} "
                f"ids but the model has {backbone.vocabulary_size} rows; the preset is damaged."
            )
        return backbone, tokenizer


def check_max_length(backbone, max_length):
    """Refuses a length beyond an absolute-position model's position table (rotary
    and relative models take any length).

    Args:
        backbone: a `TransformerBackbone`.
        max_length: int, the encoded length.

    Raises:
        ValueError: naming both lengths.

    Example:
    >>> backbone = keras_masking.models.TransformerBackbone(
    ...     vocabulary_size=10, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=16)
    >>> check_max_length(backbone, 32)
    Traceback (most recent call last):
    ...
    ValueError: max_length=32 is longer than the model's position table ...
    """
    if backbone.position == "absolute" and max_length > backbone.max_sequence_length:
        raise ValueError(
            f"max_length={max_length} is longer than the model's position table "
            f"(max_sequence_length={backbone.max_sequence_length}); pass --max-length "
            f"{backbone.max_sequence_length} or less."
        )


def checkpoint_prefix(path, argument, expected="a TF checkpoint prefix, folder or .index file"):
    """The prefix (a str) of the TF checkpoint ``path`` names, or an error naming ``argument``.

    Args:
        path: a checkpoint prefix, folder or ``.index`` file.
        argument: the flag or argument named in the message (``"--checkpoint"``).
        expected: what ``argument`` should be, for the message.

    Raises:
        FileNotFoundError: nothing at ``path``, or no checkpoint in its folder.

    Example:
    >>> checkpoint_prefix("missing/bert_model.ckpt", "--checkpoint")
    Traceback (most recent call last):
    ...
    FileNotFoundError: --checkpoint 'missing/bert_model.ckpt': no such file or folder; ...
    """
    from keras_masking.models.tf_checkpoint import resolve_checkpoint_prefix

    path = os.fspath(path)
    if not os.path.exists(path) and not os.path.exists(f"{path}.index"):
        raise FileNotFoundError(
            f"{argument} {path!r}: no such file or folder; expected {expected}."
        )
    return resolve_checkpoint_prefix(path)


def existing_file(path, argument, expected):
    """``path`` as a `pathlib.Path` if it is a file, else a FileNotFoundError.

    Args:
        path: the path to check.
        argument, expected: the flag the message names and what it should be.

    Example:
    >>> existing_file("missing.json", "--config", "a bert_config.json file")
    Traceback (most recent call last):
    ...
    FileNotFoundError: --config 'missing.json': no such file; expected a bert_config.json file.
    """
    if not os.path.isfile(path):
        what = "a folder" if os.path.isdir(path) else "no such file"
        raise FileNotFoundError(f"{argument} {path!r}: {what}; expected {expected}.")
    return pathlib.Path(path)


def _first_file(folder, names):
    return next((folder / name for name in names if (folder / name).is_file()), None)


def _first_existing(folder, names, what, argument):
    found = _first_file(folder, names)
    if found is None:
        listed = ", ".join(repr(os.fspath(folder / name)) for name in names)
        raise FileNotFoundError(f"No {what} next to the model (tried {listed}); pass {argument}.")
    return found


def model_files_sha256(files):
    """The sha256 of every file a model is read from, ``{path: hex digest}``.

    A resumed or finished run compares these with its record: a parameter-
    efficient run saves only what it trains, and reads the frozen weights
    from these files again.

    Args:
        files: `ModelSource.check`'s dict: ``model`` (a checkpoint prefix,
            whose index and data files count, or a preset folder, all of
            whose files count), ``config`` and ``vocabulary``.

    Example:
    ```python
    files = ModelSource(checkpoint="chinese_L-12_H-768_A-12/bert_model.ckpt").check()
    digests = model_files_sha256(files)  # {".../bert_model.ckpt.index": "9f2c...", ...}
    assert files["vocabulary"] in digests
    ```
    """
    model = pathlib.Path(files["model"])
    if model.is_dir():
        paths = sorted(path for path in model.rglob("*") if path.is_file())
    else:
        paths = sorted(model.parent.glob(f"{model.name}.*"))
    paths += [pathlib.Path(files[name]) for name in ("config", "vocabulary") if files.get(name)]
    return {os.fspath(path): file_sha256(path) for path in dict.fromkeys(paths)}
