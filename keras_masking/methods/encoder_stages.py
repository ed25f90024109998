"""One stage interface over TransformerBackbone and keras-hub BERT/RoBERTa.

Methods that rebuild an encoder's graph (DropToken, ...) need the same three
stages from every backbone they support: embed, run the layers with a mask,
positions and an attention bias, and pool. `TransformerBackbone` exposes them
as public methods; keras-hub's `BertBackbone` / `RobertaBackbone` expose the
layers as public attributes, composed here the way keras-hub composes them.
"""

import keras_hub
from keras import ops

from keras_masking.models.transformer_backbone import TransformerBackbone


def encoder_stages(backbone):
    """The stage adapter for a supported backbone.

    Args:
        backbone: a `TransformerBackbone`, `keras_hub.models.BertBackbone` or
            `keras_hub.models.RobertaBackbone`.

    Returns:
        An object with ``embed(inputs, position_ids)``,
        ``encode(hidden, padding_mask, position_ids, attention_bias)``,
        ``pool(hidden)`` and ``reads_positions_in_attention``.

    Example:

    ```python
    stages = encoder_stages(backbone)
    hidden = stages.embed(inputs, None)
    pooled = stages.pool(stages.encode(hidden, inputs["padding_mask"], None))
    ```
    """
    if isinstance(backbone, TransformerBackbone):
        return _TransformerBackboneStages(backbone)
    if isinstance(backbone, (keras_hub.models.BertBackbone, keras_hub.models.RobertaBackbone)):
        return _KerasHubStages(backbone)
    raise TypeError(
        "Expected a keras_masking TransformerBackbone or a keras_hub BertBackbone / "
        f"RobertaBackbone. Received: {type(backbone).__name__}"
    )


class _TransformerBackboneStages:
    def __init__(self, backbone):
        self.backbone = backbone
        self.reads_positions_in_attention = backbone.position != "absolute"

    def embed(self, inputs, position_ids):
        return self.backbone.embed(inputs["token_ids"], inputs.get("segment_ids"), position_ids)

    def encode(self, hidden, padding_mask, position_ids, attention_bias=None, **mask_hooks):
        return self.backbone.encode(
            hidden, padding_mask, position_ids, attention_bias, **mask_hooks
        )

    def pool(self, hidden):
        return self.backbone.pool(hidden)


class _KerasHubStages:
    """keras-hub's BERT / RoBERTa graph, stage by stage (absolute positions)."""

    def __init__(self, backbone):
        self.backbone = backbone
        self.is_roberta = isinstance(backbone, keras_hub.models.RobertaBackbone)
        self.reads_positions_in_attention = False

    def embed(self, inputs, position_ids):
        if position_ids is not None:
            raise ValueError(
                "Expected position_ids=None for a keras-hub backbone (it adds its own "
                f"positions). Received: position_ids with shape {tuple(position_ids.shape)}."
            )
        backbone = self.backbone
        if self.is_roberta:
            hidden = backbone.embeddings(inputs["token_ids"])
        else:
            tokens = backbone.token_embedding(inputs["token_ids"])
            positions = backbone.position_embedding(tokens)
            segments = backbone.segment_embedding(inputs["segment_ids"])
            hidden = backbone.embeddings_add((tokens, positions, segments))
        hidden = backbone.embeddings_layer_norm(hidden)
        return backbone.embeddings_dropout(hidden)

    def encode(self, hidden, padding_mask, position_ids, attention_bias=None):
        attention_mask = None
        if attention_bias is not None:
            # keras-hub merges integer masks; a hard 0/1 key mask is all it takes.
            keep = ops.cast(attention_bias[:, 0, 0, :] > -1.0, "int32")
            every_query = ops.ones_like(hidden[:, :, :1], dtype="int32")
            attention_mask = every_query * keep[:, None, :]
        for layer in self.backbone.transformer_layers:
            hidden = layer(hidden, padding_mask=padding_mask, attention_mask=attention_mask)
        return hidden

    def pool(self, hidden):
        if self.is_roberta:
            return hidden[:, 0, :]
        return self.backbone.pooled_dense(hidden[:, 0, :])
