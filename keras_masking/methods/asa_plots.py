"""ASA's diagnostic: the masked fraction per layer, from a training history."""

import os
import re

import numpy as np

from keras_masking.utils.files import write_atomically

_METRIC = re.compile(r"^masked_fraction_(\d+)$")


def masked_fractions_by_layer(history):
    """The ``masked_fraction_<layer>`` metrics of an ASA ``fit``, as an array.

    Args:
        history: the `keras.callbacks.History` that ``fit`` returned, or its
            ``.history`` dict.

    Returns:
        ``(layers, fractions)``: the attacked layer indices (sorted) and a
        float array ``(epochs, len(layers))``.

    Raises:
        ValueError: if the history holds no masked-fraction metric.
    """
    logs = getattr(history, "history", history)
    found = sorted(
        (int(match.group(1)), name) for name in logs if (match := _METRIC.match(name)) is not None
    )
    if not found:
        raise ValueError(
            "This history has no `masked_fraction_<layer>` metric: pass the history of an "
            f"ASATrainer's fit. Metrics found: {sorted(logs)}"
        )
    layers = [layer for layer, _ in found]
    fractions = np.stack([np.asarray(logs[name], dtype="float64") for _, name in found], axis=1)
    return layers, fractions


def plot_masked_fractions(history, path=None, title="ASA: masked share of real attention pairs"):
    """Draws the masked fraction per layer and per epoch (needs matplotlib).

    Left: one curve per layer over the epochs. Right: the fraction per layer
    at the first and the last epoch (the paper found lower layers masked
    more).

    Args:
        history: as for `masked_fractions_by_layer`.
        path: optional file name; the figure is written there (PNG by its
            extension), through a temporary name then renamed.
        title: the figure's title.

    Returns:
        The matplotlib ``Figure``.

    Example:
    ```python
    history = trainer.fit(features, labels, epochs=3)
    keras_masking.methods.plot_masked_fractions(history, "asa_masks.png")
    ```
    """
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib import pyplot
    except ImportError as error:
        raise ImportError(
            "plot_masked_fractions needs matplotlib: pip install 'keras-masking[plot]'."
        ) from error
    layers, fractions = masked_fractions_by_layer(history)
    epochs = np.arange(1, fractions.shape[0] + 1)
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(10, 4))
    colours = pyplot.get_cmap("viridis")(np.linspace(0, 1, len(layers)))
    for column, (layer, colour) in enumerate(zip(layers, colours)):
        left.plot(epochs, fractions[:, column], marker="o", color=colour, label=f"layer {layer}")
    left.set(xlabel="epoch", ylabel="masked fraction")
    left.legend(fontsize="small", ncol=2)
    right.plot(layers, fractions[0], marker="o", label="epoch 1")
    if len(epochs) > 1:
        right.plot(layers, fractions[-1], marker="s", label=f"epoch {len(epochs)}")
    right.set(xlabel="layer", ylabel="masked fraction", xticks=layers)
    right.legend(fontsize="small")
    figure.suptitle(title)
    figure.tight_layout()
    if path is not None:
        image_format = os.path.splitext(os.fspath(path))[1].lstrip(".") or None
        write_atomically(path, lambda file: figure.savefig(file, format=image_format), "wb")
    return figure
