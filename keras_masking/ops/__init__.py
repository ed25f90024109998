"""Pure maths used by the layers: positions, masks, gradient reversal, token selection, pooling."""

from keras_masking.ops.attention_masks import apply_replacing_mask
from keras_masking.ops.attention_masks import padding_mask_to_bias
from keras_masking.ops.gradient_reversal import reverse_gradient
from keras_masking.ops.gradient_reversal import straight_through_step
from keras_masking.ops.pooling import masked_mean
from keras_masking.ops.relative_position import relative_position_buckets
from keras_masking.ops.relative_position import relative_position_embeddings
from keras_masking.ops.relative_position import relative_position_table
from keras_masking.ops.rotary import apply_interleaved_rotary
from keras_masking.ops.rotary import apply_split_rotary
from keras_masking.ops.rotary import rotary_inverse_frequencies
from keras_masking.ops.token_selection import select_tokens
