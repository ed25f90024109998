"""TransformerTokenizer: WordPiece as Google's BERT tokenizes, for our presets.

Google's BERT tokenizer (and bert4keras, and Hugging Face's ``BertTokenizer``)
lowercases an uncased model's text with plain Unicode lowercasing. keras-hub's
`BertTokenizer` case-folds with NFKC instead, which also turns full-width
characters into ASCII: the Chinese comma "，" becomes ",", "！" becomes "!",
"（" becomes "(", "Ａ" becomes "a". Chinese BERT, RoBERTa-wwm, RoFormer and
NEZHA vocabularies hold both forms, and their pretraining saw the full-width
ones in Chinese text, so NFKC folding silently feeds a fine-tuned model other
embedding rows than it was pretrained with. `TransformerTokenizer` lowercases
as BERT does (``case_folding="bert"``, the default) and is otherwise
keras-hub's `BertTokenizer`.
"""

import keras
import keras_hub
import numpy as np

from keras_masking.models.transformer_backbone import TransformerBackbone

CASE_FOLDINGS = ("bert", "nfkc")


def lowercase_like_bert(inputs):
    """Lowercases strings as ``str.lower`` does, for every input form.

    Python strings and bytes, nested lists, numpy string arrays, and
    TensorFlow string tensors (dense or ragged, eager or in a ``tf.data``
    graph). TensorFlow lowercases with ICU's case mapping, which equals
    Python's for every character outside the newest Unicode additions.

    Args:
        inputs: one of the forms above.

    Returns:
        The same form, lowercased.

    Example:
    >>> lowercase_like_bert(["Ｈello，世界！", b"ABC"])
    ['ｈello，世界！', b'abc']
    """
    if isinstance(inputs, str):
        return inputs.lower()
    if isinstance(inputs, bytes):
        return inputs.decode("utf-8").lower().encode("utf-8")
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(lowercase_like_bert(value) for value in inputs)
    if isinstance(inputs, np.ndarray):
        return np.vectorize(lowercase_like_bert, otypes=[inputs.dtype])(inputs)
    import tensorflow as tf

    if isinstance(inputs, tf.RaggedTensor):
        return tf.ragged.map_flat_values(tf.strings.lower, inputs, encoding="utf-8")
    return tf.strings.lower(inputs, encoding="utf-8")


@keras.saving.register_keras_serializable(package="keras_masking")
class TransformerTokenizer(keras_hub.tokenizers.BertTokenizer):
    """keras-hub's `BertTokenizer`, lowercasing as Google's BERT, for our presets.

    With ``lowercase=True`` and ``case_folding="bert"`` the text is
    lowercased with plain Unicode lowercasing and its accents stripped (NFD,
    marks removed), as Google's BERT tokenizer does for uncased models, so
    full-width punctuation and letters keep their own vocabulary rows
    (keras-hub's NFKC folding maps "，" to ","). ``case_folding="nfkc"`` is
    keras-hub's behaviour.

    keras-hub picks the tokenizer class of a preset from the backbone class
    it declares (``backbone_cls``): this is the class it finds for a
    `TransformerBackbone` preset, so ``keras_hub.tokenizers.Tokenizer.
    from_preset(folder)`` loads the tokenizer saved there.

    Args:
        vocabulary: a list of tokens or a ``vocab.txt`` path.
        lowercase: bool. True for uncased English and for Chinese BERT.
        strip_accents: bool or None (None: as ``lowercase``, as BERT does).
        case_folding: ``"bert"`` or ``"nfkc"``, how ``lowercase`` lowercases.
        **kwargs: other `keras_hub.tokenizers.BertTokenizer` arguments.

    Example:
    >>> vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "好", "，", ",", "a"]
    >>> tokenizer = TransformerTokenizer(vocabulary=vocabulary, lowercase=True)
    >>> [int(i) for i in tokenizer("好，A")]
    [5, 6, 8]
    >>> nfkc = TransformerTokenizer(vocabulary=vocabulary, lowercase=True, case_folding="nfkc")
    >>> [int(i) for i in nfkc("好，A")]
    [5, 7, 8]
    """

    backbone_cls = TransformerBackbone

    def __init__(
        self,
        vocabulary=None,
        lowercase=False,
        strip_accents=None,
        case_folding="bert",
        **kwargs,
    ):
        if case_folding not in CASE_FOLDINGS:
            raise ValueError(
                f"Expected case_folding in {CASE_FOLDINGS}. "
                f"Received: case_folding={case_folding!r}."
            )
        if not isinstance(lowercase, bool):
            raise ValueError(f"Expected True or False for lowercase. Received: {lowercase!r}.")
        bert_lowercase = lowercase and case_folding == "bert"
        if bert_lowercase and kwargs.get("special_tokens_in_strings"):
            raise ValueError(
                "case_folding='bert' lowercases whole strings, special tokens written in them "
                "included; with special_tokens_in_strings=True use case_folding='nfkc'."
            )
        self.bert_lowercase = bert_lowercase
        self.case_folding = case_folding
        super().__init__(
            vocabulary=vocabulary,
            lowercase=lowercase and not bert_lowercase,
            strip_accents=lowercase if strip_accents is None else strip_accents,
            **kwargs,
        )

    def tokenize(self, inputs):
        if self.bert_lowercase:
            inputs = lowercase_like_bert(inputs)
        return super().tokenize(inputs)

    def get_config(self):
        config = super().get_config()
        config["lowercase"] = self.lowercase or self.bert_lowercase
        config["case_folding"] = self.case_folding
        return config
