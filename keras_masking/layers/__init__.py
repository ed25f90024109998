"""Keras layers: one concept a file."""

from keras_masking.layers.activations import gelu_approximate
from keras_masking.layers.activations import gelu_exact
from keras_masking.layers.add_ffn import AddFFN
from keras_masking.layers.attention_adversary import AttentionAdversary
from keras_masking.layers.attention_units import AttentionUnits
from keras_masking.layers.dag_transition import DAGTransition
from keras_masking.layers.drop_token import DropToken
from keras_masking.layers.drop_token import RestoreDroppedTokens
from keras_masking.layers.feed_forward import FeedForward
from keras_masking.layers.global_pointer import GlobalPointer
from keras_masking.layers.gradient_reversal import GradientReversal
from keras_masking.layers.key_value_prefix import KeyValuePrefix
from keras_masking.layers.key_value_prefix import PrefixEncoder
from keras_masking.layers.key_value_prefix import key_value_prefixes
from keras_masking.layers.lora_dense import LoRADense
from keras_masking.layers.masked_lm_head import MaskedLMHead
from keras_masking.layers.multiple_choice import ChoiceLogits
from keras_masking.layers.multiple_choice import FlattenChoices
from keras_masking.layers.self_attention import SelfAttention
from keras_masking.layers.span_logits import MaskedSpanLogits
from keras_masking.layers.state_expansion import StateExpansion
from keras_masking.layers.transformer_block import TransformerBlock
from keras_masking.layers.transformer_embedding import TransformerEmbedding
