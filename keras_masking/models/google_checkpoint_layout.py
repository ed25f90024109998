"""Names of a backbone's weights in Google's TF checkpoint layout.

Google's BERT checkpoints (and the RoBERTa-wwm, RoFormer and NEZHA ones that
follow them) store every weight under a fixed name such as
``bert/encoder/layer_0/attention/self/query/kernel``. This module pairs those
names with the variables of a `TransformerBackbone` (and its MLM head), so the
TF checkpoint reader and writer, and the keras-hub converter, share one table.
"""

from keras_masking.ops.lora_merge import merged_kernel

EMBEDDINGS = "bert/embeddings"
POOLER = "bert/pooler/dense"
MLM = "cls/predictions"

# Weights in checkpoints that no backbone or MLM head uses: pretraining heads
# and training state. They are skipped on load and listed in the report.
KNOWN_EXTRA_PREFIXES = ("cls/seq_relationship/",)
TRAINING_STATE_SUFFIXES = ("/adam_m", "/adam_v", "/Adam", "/Adam_1")
TRAINING_STATE_NAMES = ("global_step", "_CHECKPOINTABLE_OBJECT_GRAPH")


def _dense(prefix, dense):
    return {f"{prefix}/kernel": merged_kernel(dense), f"{prefix}/bias": dense.bias}


def _layer_norm(prefix, layer_norm):
    return {f"{prefix}/gamma": layer_norm.gamma, f"{prefix}/beta": layer_norm.beta}


def backbone_variables_by_name(backbone):
    """Maps Google checkpoint names to a `TransformerBackbone`'s variables.

    Args:
        backbone: a built `keras_masking.models.TransformerBackbone`.

    Returns:
        A dict ``{checkpoint_name: keras.Variable}`` holding every weight of
        the backbone exactly once.
    """
    embeddings = backbone.embeddings
    names = {f"{EMBEDDINGS}/word_embeddings": embeddings.token_embedding.embeddings}
    if embeddings.segment_embedding is not None:
        names[f"{EMBEDDINGS}/token_type_embeddings"] = embeddings.segment_embedding.embeddings
    if embeddings.position_embedding is not None:
        names[f"{EMBEDDINGS}/position_embeddings"] = embeddings.position_embedding.embeddings
    names.update(_layer_norm(f"{EMBEDDINGS}/LayerNorm", embeddings.layer_norm))
    for i, block in enumerate(backbone.transformer_layers):
        prefix = f"bert/encoder/layer_{i}"
        attention, feed_forward = block.self_attention, block.feed_forward
        for part in ("query", "key", "value"):
            names.update(_dense(f"{prefix}/attention/self/{part}", getattr(attention, part)))
        names.update(_dense(f"{prefix}/attention/output/dense", attention.attention_output))
        names.update(
            _layer_norm(f"{prefix}/attention/output/LayerNorm", block.attention_layer_norm)
        )
        names.update(_dense(f"{prefix}/intermediate/dense", feed_forward.intermediate_dense))
        names.update(_dense(f"{prefix}/output/dense", feed_forward.output_dense))
        names.update(_layer_norm(f"{prefix}/output/LayerNorm", block.feed_forward_layer_norm))
    if backbone.pooled_dense is not None:
        names.update(_dense(POOLER, backbone.pooled_dense))
    return names


def masked_lm_head_variables_by_name(head):
    """Maps ``cls/predictions/...`` names to a `MaskedLMHead`'s variables.

    The output projection is the (tied) word embedding and is not repeated.
    """
    names = _dense(f"{MLM}/transform/dense", head.transform_dense)
    names.update(_layer_norm(f"{MLM}/transform/LayerNorm", head.transform_layer_norm))
    names[f"{MLM}/output_bias"] = head.output_bias
    return names


def model_variables_by_name(model):
    """Names for a `TransformerBackbone` or a `TransformerMaskedLM`."""
    head = getattr(model, "masked_lm_head", None)
    backbone = getattr(model, "backbone", model)
    names = backbone_variables_by_name(backbone)
    if head is not None:
        names.update(masked_lm_head_variables_by_name(head))
    return names


def is_training_state(name):
    """True for optimizer slots and counters that a model never loads."""
    return name in TRAINING_STATE_NAMES or name.endswith(TRAINING_STATE_SUFFIXES)
