"""P-tuning v2: trainable per-layer key/value prefixes on a frozen backbone."""

from keras_masking.methods.backbone_surgery import as_transformer_backbone
from keras_masking.methods.backbone_surgery import transformer_backbones
from keras_masking.methods.parameter_report import parameter_report


def prefix_tune(
    model,
    length=160,
    reparameterize=False,
    layers=None,
    dropout=0.1,
    hidden_units=512,
    verbose=True,
):
    """Attaches P-tuning v2 prefixes to every (or the chosen) layer and freezes the backbone.

    Each layer gets ``length`` trainable keys and values per head
    (`KeyValuePrefix`), attended by every query through the attention's
    ``kv_prefix`` hook, with dropout on the prefixes. The backbone's weights,
    LayerNorms included, are frozen; the task head keeps its flags. At
    ``length=160`` on a 12-layer base model this is 2,949,120 parameters, the
    budget of FL-tuning with 160 units.

    Args:
        model: as for `keras_masking.fl_tune`.
        length: int >= 0, prefix length (0 leaves the function unchanged).
        reparameterize: bool, P-tuning v2's MLP reparameterisation.
        layers: list of layer indices, or None for every layer.
        dropout: float, dropout on the prefixes (0.1).
        hidden_units: int, width of the reparameterisation MLP.
        verbose: bool, print the trainable count and ratio.

    Returns:
        The tuned model (``model`` itself, or the converted keras-hub backbone).

    Example:
    ```python
    classifier = keras_masking.prefix_tune(classifier, length=160)
    ```
    """
    model = as_transformer_backbone(model)
    for backbone in transformer_backbones(model):
        if backbone.key_value_prefix is not None:
            raise ValueError(
                f"This backbone already has key/value prefixes ({backbone.key_value_prefix}); "
                "detach them first (backbone.detach_attachments())."
            )
        backbone.attach_key_value_prefixes(
            length,
            layers,
            dropout=dropout,
            reparameterize=reparameterize,
            hidden_units=hidden_units,
        )
        backbone.freeze_base()
    if verbose:
        print(f"P-tuning v2: prefix length {length}; {parameter_report(model)}")
    return model
