"""A preset's README.md: what the model is, which methods are on, how it was trained."""

import json
import pathlib

from keras_masking.utils.files import write_atomically

POSITIONS = {
    "absolute": "BERT / RoBERTa (learned absolute positions)",
    "rotary": "RoFormer (rotary positions)",
    "relative": "NEZHA (relative positions)",
    "rotary2d": "ExLM (2D rotary positions)",
}
METHODS = {
    "mlm_embedding_correction": "MLM embedding correction",
    "drop_token": "DropToken (training only)",
    "asa": "ASA (training only; its adversaries are saved for resuming)",
    "add_ffn": "FL-tuning (addFFN units)",
    "merged_add_ffn": "FL-tuning, merged into the FFNs",
    "key_value_prefix": "P-tuning v2 prefixes",
    "add_attention_units": "MA-tuning attention units",
    "lora": "LoRA",
}


def model_card(backbone, title=None, head=None, training=None):
    """The Markdown model card of a backbone (and its task head).

    Args:
        backbone: a `TransformerBackbone`.
        title: the card's title; None for the backbone's name.
        head: None, or a one-line description of the task head.
        training: None, or a dict of facts about how the model was trained
            (a CLUE run's task, data, methods, settings and scores), written
            as JSON.

    Returns:
        The card's text.

    Example:
    ```python
    text = keras_masking.models.model_card.model_card(backbone, training={"task": "tnews"})
    ```
    """
    config = backbone.get_config()
    lines = [f"# {title or backbone.name}", ""]
    lines += [
        "A keras_masking `TransformerBackbone`" + (f" with a task head: {head}." if head else "."),
        "",
        "## Model",
        "",
        f"- Family: {POSITIONS.get(config['position'], config['position'])}",
        f"- Layers {config['num_layers']}, hidden {config['hidden_dim']}, heads "
        f"{config['num_heads']}, FFN {config['intermediate_dim']}, vocabulary "
        f"{config['vocabulary_size']}, activation {config['activation']}",
        f"- Parameters: {backbone.count_params():,}",
        "",
        "## Methods on",
        "",
    ]
    on = [(key, config.get(key)) for key in METHODS if config.get(key)]
    if not on:
        lines.append("- none: a plain encoder")
    for key, record in on:
        lines.append(f"- {METHODS[key]}: `{json.dumps(record, sort_keys=True)}`")
    lines += [
        "",
        "## Loading",
        "",
        "```python",
        "import keras_masking",
        'backbone = keras_masking.models.TransformerBackbone.from_preset("PRESET_FOLDER")',
        "```",
    ]
    if training:
        lines += ["", "## Training", "", "```json", json.dumps(training, indent=1), "```"]
    return "\n".join(lines) + "\n"


def write_model_card(folder, text):
    """Writes ``text`` as ``folder/README.md`` (through a temporary file).

    Args:
        folder: an existing folder.
        text: the card, from `model_card`.

    Returns:
        The README's path.

    Example:
    ```python
    import tempfile
    write_model_card(tempfile.mkdtemp(), model_card(backbone))
    ```
    """
    return write_atomically(pathlib.Path(folder) / "README.md", lambda file: file.write(text))
