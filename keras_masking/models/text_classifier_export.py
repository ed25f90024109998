"""A SavedModel of a `TransformerTextClassifier` that takes strings and serves predictions."""

import keras
import keras_hub

from keras_masking.models.unigram_tokenizer import UnigramTokenizer
from keras_masking.utils.arguments import check_bool

FEATURES = ("token_ids", "segment_ids", "padding_mask")


def export_text_classifier(classifier, filepath, text_pairs=False, verbose=True):
    """Writes ``classifier``'s serving copy as a SavedModel whose signatures take strings.

    The SavedModel holds the plain inference model (`serving_copy`: DropToken
    and ASA off, FL-tuning and LoRA merged) and the preprocessor's
    tokenizer and packer as TensorFlow ops, so it serves from
    ``tf.saved_model.load(filepath)`` in a process that imports TensorFlow
    and tensorflow-text only (BERT's WordPiece and multilingual-e5's
    unigram ops are tensorflow-text's: ``import tensorflow_text`` before
    loading). It works from the TensorFlow and the JAX backend (JAX through
    ``jax2tf``).

    Signatures:

    * ``serving_default``: ``serve_texts``, or ``serve_text_pairs`` with
      ``text_pairs=True``;
    * ``serve_texts(texts)``: a batch of strings ``(batch,)``;
    * ``serve_text_pairs(texts_a, texts_b)``: two batches of strings;
    * ``serve_features(token_ids, segment_ids, padding_mask)``: int32
      ``(batch, sequence_length)``, as the model takes them.

    The string signatures return ``logits``, ``probabilities`` (softmax) and
    ``class_id`` (int32) for a classifier without an output activation;
    with one, ``scores`` (the activation's outputs) and ``class_id``.

    Args:
        classifier: a `TransformerTextClassifier` with a preprocessor.
        filepath: the SavedModel folder to write.
        text_pairs: bool, whether ``serving_default`` takes pairs.
        verbose: bool, whether Keras prints the signatures.

    Example:
    ```python
    classifier.export("served")  # classifier.export is this call, with a preprocessor
    # In a service: import tensorflow as tf, tensorflow_text
    # served = tf.saved_model.load("served")
    # served.signatures["serving_default"](texts=tf.constant(["..."]))["class_id"]
    ```
    """
    import tensorflow as tf

    text_pairs = check_bool("text_pairs", text_pairs)
    if classifier.preprocessor is None:
        raise ValueError(
            "A SavedModel that takes strings needs the classifier's preprocessor. Received: a "
            "classifier without one; classifier.export(path) then exports the token-id model, "
            "as Keras does."
        )
    tokenizer = classifier.preprocessor.tokenizer
    if not isinstance(tokenizer, (keras_hub.tokenizers.BertTokenizer, UnigramTokenizer)):
        raise ValueError(
            "A SavedModel that takes strings needs a tokenizer that runs as TensorFlow ops (a "
            "keras-hub BertTokenizer, WordPiece, or a UnigramTokenizer, multilingual-e5's). "
            f"Received: a preprocessor with a {type(tokenizer).__name__}; "
            "export the token-id model instead: classifier.export(path, input_signature=...) "
            "or classifier.serving_copy() without its preprocessor."
        )
    model = classifier.serving_copy()
    preprocessor = model.preprocessor
    length = preprocessor.sequence_length
    specs = {name: tf.TensorSpec((None, length), tf.int32, name=name) for name in FEATURES}
    archive = keras.export.ExportArchive()
    serve_features = archive.track_and_add_endpoint("serve_features", model, [specs])
    if not preprocessor.built:
        preprocessor.build(None)  # its packer
    archive.track(preprocessor)

    def predictions(features):
        scores = serve_features({name: tf.cast(features[name], tf.int32) for name in FEATURES})
        class_id = tf.argmax(scores, axis=-1, output_type=tf.int32)
        if model.activation in (None, keras.activations.linear):
            return {"logits": scores, "probabilities": tf.nn.softmax(scores), "class_id": class_id}
        return {"scores": scores, "class_id": class_id}

    def texts(*names):
        return [tf.TensorSpec((None,), tf.string, name=name) for name in names]

    @tf.function(input_signature=texts("texts"))
    def serve_texts(texts):
        return predictions(preprocessor(texts))

    @tf.function(input_signature=texts("texts_a", "texts_b"))
    def serve_text_pairs(texts_a, texts_b):
        return predictions(preprocessor(x=(texts_a, texts_b)))

    archive.add_endpoint("serve_texts", serve_texts)
    archive.add_endpoint("serve_text_pairs", serve_text_pairs)
    archive.add_endpoint("serving_default", serve_text_pairs if text_pairs else serve_texts)
    archive.write_out(str(filepath), verbose=verbose)


def token_id_signature(model, input_signature=None, export_kwargs=None):
    """A JAX export's input signature in which every input shares one batch and one length.

    Keras' JAX export gives each unknown dimension of each input its own
    symbol, so ``token_ids`` ``(batch, a)`` and ``segment_ids`` ``(batch,
    b)`` no longer add up; this names them all ``(batch, sequence)``
    (``jax2tf``'s ``polymorphic_shapes``) unless ``export_kwargs`` already
    holds ``jax2tf_kwargs``. A length the model's inputs fix stays fixed.

    Args:
        model: a model whose inputs are a dict of ``(batch, sequence)`` ids.
        input_signature: None for the model's own inputs, or Keras' dict of
            specs.
        export_kwargs: the other ``export`` arguments, or None.

    Returns:
        ``(input_signature, export_kwargs)`` for ``keras.Model.export``.

    Example:
    ```python
    signature, kwargs = token_id_signature(classifier)
    kwargs["jax2tf_kwargs"]["polymorphic_shapes"][0]["token_ids"]  # '(batch, sequence)'
    # on JAX: keras.Model.export(classifier, path, input_signature=signature, **kwargs)
    ```
    """
    export_kwargs = dict(export_kwargs or {})
    if input_signature is None:
        input_signature = [
            {
                name: keras.InputSpec(shape=tuple(tensor.shape), dtype=tensor.dtype)
                for name, tensor in model.input.items()
            }
        ]
    if "jax2tf_kwargs" not in export_kwargs:

        def shape(spec):
            # A length the model fixes (ExLM's expansion needs one) stays fixed.
            length = tuple(spec.shape)[1] if len(spec.shape) > 1 else None
            dims = ["batch", "sequence" if length is None else str(length)]
            return f"({', '.join(dims + [str(d) for d in tuple(spec.shape)[2:]])})"

        shapes = keras.tree.map_structure(shape, input_signature)
        export_kwargs["jax2tf_kwargs"] = {"polymorphic_shapes": shapes}
    return input_signature, export_kwargs
