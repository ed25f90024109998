"""Text input: tokenizers, encoders and streamed pretraining batches for BERT-family models."""

from keras_masking.data.repeated_mlm import RepeatedMLMBatch
from keras_masking.data.repeated_mlm import repeated_mlm
from keras_masking.data.text_shards import text_shard_dataset
from keras_masking.data.text_shards import text_shard_files
from keras_masking.data.tokenization import bert_tokenizer
from keras_masking.data.tokenization import encode_texts
