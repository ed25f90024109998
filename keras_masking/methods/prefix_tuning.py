"""P-tuning v2: trainable per-layer key/value prefixes on a frozen backbone."""

from keras_masking.layers.key_value_prefix import _check_bool
from keras_masking.methods.backbone_surgery import as_transformer_backbone
from keras_masking.methods.backbone_surgery import transformer_backbones
from keras_masking.methods.fl_tuning import _backbones_to_tune
from keras_masking.methods.fl_tuning import _check_layer_list
from keras_masking.methods.fl_tuning import _check_layer_range
from keras_masking.methods.fl_tuning import _check_verbose
from keras_masking.methods.fl_tuning import _report
from keras_masking.methods.fl_tuning import _unchanged_on_error
from keras_masking.methods.parameter_report import parameter_report
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int


def prefix_tune(
    model,
    length=160,
    reparameterize=False,
    layers=None,
    dropout=0.1,
    hidden_units=512,
    verbose=False,
):
    """Attaches P-tuning v2 prefixes to every (or the chosen) layer and freezes the backbone.

    Each layer gets ``length`` trainable keys and values per head
    (`KeyValuePrefix`), attended by every query through the attention's
    ``kv_prefix`` hook, with dropout on the prefixes. The backbone's weights,
    LayerNorms included, are frozen; the task head keeps its flags. At
    ``length=160`` on a 12-layer base model this is 2,949,120 parameters, the
    budget of FL-tuning with 160 units.

    ``reparameterize=True`` is P-tuning v2's ``prefix_projection``: one MLP
    shared by all tuned layers (`PrefixEncoder`), ``Embedding(length, d) ->
    Dense(hidden_units) -> tanh -> Dense(layers * 2 * d)``, gives every
    layer's keys and values.

    Every argument is checked before the model is touched: a refused call
    leaves the model as it was. The trainable count and ratio are logged at
    INFO level (logger ``keras_masking.methods.fl_tuning``); ``verbose=True``
    also prints them.

    Args:
        model: as for `keras_masking.fl_tune`.
        length: int >= 0, prefix length (0 leaves the function unchanged).
        reparameterize: bool, P-tuning v2's shared MLP reparameterisation.
        layers: list of distinct layer indices in ``[0, num_layers)``, or
            None for every layer.
        dropout: float in [0, 1), dropout on the prefixes (0.1).
        hidden_units: int >= 1, width of the reparameterisation MLP (512).
        verbose: bool, also print the trainable count and ratio.

    Returns:
        The tuned model (``model`` itself, or the converted keras-hub backbone).

    Example:
    ```python
    classifier = keras_masking.prefix_tune(classifier, length=160)
    classifier.compile(
        optimizer=keras.optimizers.Adam(5e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    ```
    """
    length = check_int("length", length, minimum=0)
    reparameterize = _check_bool("reparameterize", reparameterize)
    layers = _check_layer_list(layers)
    dropout = check_float("dropout", dropout, 0.0, 1.0, open_maximum=True)
    hidden_units = check_int("hidden_units", hidden_units, minimum=1)
    verbose = _check_verbose(verbose)
    for backbone in _backbones_to_tune(model):
        if backbone.key_value_prefix is not None:
            raise ValueError(
                f"This backbone already has key/value prefixes ({backbone.key_value_prefix}); "
                "detach them first (backbone.detach_attachments())."
            )
        _check_layer_range(layers, backbone.num_layers_built)
    model = as_transformer_backbone(model)
    backbones = transformer_backbones(model)
    with _unchanged_on_error(backbones):
        for backbone in backbones:
            backbone.attach_key_value_prefixes(
                length,
                layers,
                dropout=dropout,
                reparameterize=reparameterize,
                hidden_units=hidden_units,
            )
            backbone.freeze_base()
    _report(f"P-tuning v2: prefix length {length}; {parameter_report(model)}", verbose)
    return model
