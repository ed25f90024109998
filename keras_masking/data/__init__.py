"""Text input: tokenizers and encoders for BERT-family models."""

from keras_masking.data.repeated_mlm import RepeatedMLMBatch
from keras_masking.data.repeated_mlm import repeated_mlm
from keras_masking.data.tokenization import bert_tokenizer
from keras_masking.data.tokenization import encode_texts
