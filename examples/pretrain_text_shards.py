"""Pretrains an MLM or ExLM encoder from sharded text files, resumably.

The corpus is streamed from the files (one passage per line, UTF-8) with
`keras_masking.data.text_shard_dataset`, so it never has to fit in memory.
``--objective exlm`` trains `keras_masking.models.ExLMPretrainer` (a
``rotary2d`` backbone; the model masks its inputs itself); ``--objective
mlm`` trains BERT's recipe, `keras_masking.models.TransformerMaskedLM` on
an absolute-position backbone with BERT's masking done in the input
pipeline.

Usage:
    python examples/pretrain_text_shards.py                  # tiny run on a built-in corpus
    python examples/pretrain_text_shards.py --files "corpus/*.txt" --vocab vocab.txt \\
        --objective exlm --model-size base --steps 100000 --batch-size 256 \\
        --sequence-length 128 --checkpoint-dir runs/exlm --steps-per-checkpoint 1000

With no ``--files``, a small generated Chinese corpus and its vocabulary are
written to a temporary folder (or ``--checkpoint-dir``/corpus) and a tiny
model trains on them for 20 steps, in well under a minute on CPU.
``--no-jit-compile`` runs the steps without XLA, which starts tiny models
sooner on CPU.

Resuming. Every ``--steps-per-checkpoint`` steps the whole training state is
written to ``--checkpoint-dir``/checkpoint.npz (written to a temporary name,
then renamed, so an interruption never leaves half a checkpoint): the
weights, the optimizer state, the random generators' states (dropout, the
ExLM masking) and the number of steps done. Rerun the same command after an
interruption and it continues from the last checkpoint; the input pipeline
is deterministic and skips the batches already trained on, so the resumed
run takes the same batches and random draws as an uninterrupted run, and
ends with its weights. ``--stop-after N`` stops after N steps with a
checkpoint, as an interruption would. A run that reached ``--steps`` does
nothing when rerun; a larger ``--steps`` continues it. ``run.json`` holds
the settings a resumed run must share (objective, sizes, batch, seed,
vocabulary, files); a rerun with other settings stops with an error. At the
end the backbone and its tokenizer are saved as a keras-hub preset in
``--checkpoint-dir``/backbone (`keras_masking.models.TransformerBackbone.
from_preset` loads it).

Data parallel, one host (``--data-parallel``): on JAX the model is built
under ``keras.distribution.DataParallel`` over
``keras.distribution.list_devices()``; on TensorFlow under
``tf.distribute.MirroredStrategy()``. ``--batch-size`` is the global batch.
Steps compile with XLA (``jit_compile=True``) on JAX and on a single
TensorFlow device; under a `tf.distribute` strategy they run without XLA,
since Keras cannot XLA-compile a TensorFlow step over the strategy's
mirrored variables.

Several hosts: each host reads its own files (every N-th file of the sorted
list, see `keras_masking.data.text_shard_files`), so give at least as many
files as hosts, and a ``--checkpoint-dir`` on a file system every host
sees (the first host writes it, every host reads it to resume).

* JAX: run the same command on every host with ``--data-parallel
  --coordinator-address HOST0:1234 --num-processes N --process-id I``
  (``--coordinator-address auto`` where JAX detects the cluster itself:
  TPU pods, SLURM, Open MPI). The script calls
  ``jax.distributed.initialize(...)`` then
  ``keras.distribution.set_distribution(keras.distribution.DataParallel(
  devices=keras.distribution.list_devices(), auto_shard_dataset=False))``;
  host I reads its files and gives its part of the batch (``--batch-size /
  N``).
* TensorFlow: set ``TF_CONFIG`` on every host (``{"cluster": {"worker":
  [...]}, "task": {"type": "worker", "index": I}}``) and pass
  ``--data-parallel``: the script builds the model under
  ``tf.distribute.MultiWorkerMirroredStrategy()``, and host I reads its
  files (``shard_index=I``, ``num_shards=N``; the dataset turns
  tf.distribute's own sharding off) and trains on ``--batch-size / N`` of
  their rows per step. Keras 3.15's TensorFlow trainer cannot run this yet:
  before the first step it averages the first batch across the workers,
  which fails for models taking a dict of inputs, as both pretrainers do
  (keras-team/keras#20329). One host with ``MirroredStrategy`` works, and
  JAX trains across hosts.
"""

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import shutil
import sys
import tempfile
import uuid

import keras
import numpy as np

import keras_masking
from keras_masking.clue.run_folder import write_atomically as write_file_atomically
from keras_masking.data import bert_tokenizer
from keras_masking.data import text_shard_dataset
from keras_masking.data import text_shard_files

# (layers, hidden width, attention heads, FFN width) of each --model-size.
MODEL_SIZES = {
    "tiny": (1, 32, 2, 64),
    "small": (4, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
}
LEARNING_RATES = {"tiny": 1e-3, "small": 5e-4, "base": 1e-4}
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CHECKPOINT = "checkpoint.npz"
RUN_SETTINGS = "run.json"
BACKBONE = "backbone"


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", nargs="+", help="text files or glob patterns (quote them)")
    parser.add_argument("--vocab", help="the WordPiece vocab.txt (needed with --files)")
    parser.add_argument("--objective", choices=("exlm", "mlm"), default="exlm")
    parser.add_argument("--steps", type=positive_int, default=20, help="training steps in all")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="global batch size")
    parser.add_argument("--sequence-length", type=int, default=32)
    parser.add_argument("--model-size", choices=tuple(MODEL_SIZES), default="tiny")
    parser.add_argument("--checkpoint-dir", help="where the run lives (default: a new temp folder)")
    parser.add_argument("--steps-per-checkpoint", type=positive_int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-rate", type=float, help="AdamW's rate (default: by size)")
    parser.add_argument("--k", type=positive_int, default=4, help="ExLM's states per [MASK]")
    parser.add_argument("--shuffle-buffer", type=int, default=10_000, help="windows shuffled")
    parser.add_argument(
        "--data-parallel", action="store_true", help="train on every device (and host)"
    )
    parser.add_argument("--coordinator-address", help="JAX multi-host: host 0's address, or auto")
    parser.add_argument("--num-processes", type=positive_int, help="JAX multi-host: hosts")
    parser.add_argument("--process-id", type=int, help="JAX multi-host: this host's index")
    parser.add_argument(
        "--no-jit-compile",
        action="store_true",
        help="run the steps without XLA (tiny models on CPU start faster)",
    )
    parser.add_argument(
        "--stop-after",
        type=positive_int,
        help="stop (with a checkpoint) after this many steps in all, as an interruption would",
    )
    args = parser.parse_args(argv)
    if args.files and not args.vocab:
        parser.error("--vocab: give the vocabulary of the tokenizer that reads --files.")
    if args.sequence_length < 3:
        parser.error(f"--sequence-length: expected at least 3, got {args.sequence_length}.")
    if args.seed < 0:
        parser.error(f"--seed: expected an integer >= 0, got {args.seed}.")
    if args.shuffle_buffer < 0:
        parser.error(f"--shuffle-buffer: expected an integer >= 0, got {args.shuffle_buffer}.")
    if args.coordinator_address and not args.data_parallel:
        parser.error("--coordinator-address: multi-host training needs --data-parallel.")
    if args.coordinator_address and keras.config.backend() != "jax":
        parser.error("--coordinator-address is for JAX; TensorFlow reads TF_CONFIG.")
    if args.learning_rate is None:
        args.learning_rate = LEARNING_RATES[args.model_size]
    return args


# === The built-in corpus ===
def default_corpus(folder, shards=4, lines_per_shard=100):
    """Writes a small generated Chinese corpus and its vocab.txt; returns (files, vocab)."""
    subjects = ["我", "你", "他", "她", "我们", "老师", "学生", "小明", "小红", "朋友们"]
    times = ["今天", "明天", "昨天", "周末", "早上", "晚上", "每天"]
    places = ["在家里", "在学校", "在公园", "在北京", "在上海", "在图书馆", "在河边"]
    actions = ["看书", "写字", "吃饭", "喝茶", "学习中文", "听音乐", "打球", "做饭", "画画"]
    endings = ["。", "！", "，天气很好。", "，心情不错。", "，大家都很开心。"]
    rng = np.random.default_rng(1998)  # the same corpus whatever --seed
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for shard in range(shards):
        lines = [
            "".join(rng.choice(words) for words in (times, subjects, places, actions, endings))
            for _ in range(lines_per_shard)
        ]
        path = folder / f"shard-{shard:05d}-of-{shards:05d}.txt"
        write_atomically(path, "\n".join(lines) + "\n")
        files.append(str(path))
    characters = sorted(
        {character for path in files for character in pathlib.Path(path).read_text("utf-8")}
        - {"\n"}
    )
    vocab = folder / "vocab.txt"
    write_atomically(vocab, "\n".join(list(SPECIAL_TOKENS) + characters) + "\n")
    return files, str(vocab)


# === Files ===
def write_atomically(path, content):
    """Writes text or bytes to ``path`` through a temporary name, then renames it."""
    mode = "w" if isinstance(content, str) else "wb"
    return write_file_atomically(path, lambda file: file.write(content), mode=mode)


def run_settings(args, files, vocab):
    """What a resumed run must share with the run it continues."""
    return {
        "objective": args.objective,
        "model_size": args.model_size,
        "sequence_length": args.sequence_length,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "k": args.k if args.objective == "exlm" else None,
        "learning_rate": args.learning_rate,
        "shuffle_buffer": args.shuffle_buffer,
        "vocabulary_sha256": hashlib.sha256(pathlib.Path(vocab).read_bytes()).hexdigest(),
        "files": [[pathlib.Path(path).name, os.path.getsize(path)] for path in files],
    }


def check_same_run(folder, settings):
    """Records the settings of a new run; refuses to resume another run's folder."""
    path = folder / RUN_SETTINGS
    if path.is_file():
        recorded = json.loads(path.read_text("utf-8"))
        changed = sorted(name for name in settings if recorded.get(name) != settings[name])
        if changed:
            details = ", ".join(
                f"{name}: {recorded.get(name)!r} -> {settings[name]!r}" for name in changed
            )
            raise ValueError(
                f"{folder} holds a run with other settings ({details}). Resume it with its "
                "settings, or pass another --checkpoint-dir."
            )
    else:
        write_atomically(path, json.dumps(settings, indent=2) + "\n")


def steps_done(folder):
    """Steps recorded in the folder's checkpoint (0 with none)."""
    path = folder / CHECKPOINT
    if not path.is_file():
        return 0
    with np.load(path) as checkpoint:
        return int(checkpoint["steps_done"])


def training_state(model):
    """Every variable a step changes: weights, random states, optimizer state."""
    return list(model.variables) + list(model.optimizer.variables)


def save_checkpoint(model, folder, steps):
    if keras.config.backend() == "jax":
        model.jax_state_sync()  # fit keeps the JAX state apart until then
    arrays = {f"v{index}": variable.numpy() for index, variable in enumerate(training_state(model))}
    buffer = _npz_bytes(steps_done=np.asarray(steps, "int64"), **arrays)
    write_atomically(folder / CHECKPOINT, buffer)


def _npz_bytes(**arrays):
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def load_checkpoint(model, folder):
    """Restores a checkpoint into ``model``; returns the steps it had done."""
    variables = training_state(model)
    with np.load(folder / CHECKPOINT) as checkpoint:
        count = len(checkpoint.files) - 1
        if count != len(variables):
            raise ValueError(
                f"{folder / CHECKPOINT} holds {count} variables, this model has "
                f"{len(variables)}: it was written by another model."
            )
        for index, variable in enumerate(variables):
            value = checkpoint[f"v{index}"]
            if tuple(value.shape) != tuple(variable.shape):
                raise ValueError(
                    f"{folder / CHECKPOINT}: variable {index} ({variable.path}) has shape "
                    f"{value.shape} there, {tuple(variable.shape)} here."
                )
            variable.assign(value)
        return int(checkpoint["steps_done"])


def save_backbone(backbone, tokenizer, folder):
    """The backbone and tokenizer as a keras-hub preset, written under a temporary name."""
    final = folder / BACKBONE
    staging = folder / f".{BACKBONE}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        backbone.save_to_preset(str(staging))
        tokenizer.save_to_preset(str(staging))
        if final.exists():
            old = folder / f".{BACKBONE}.old-{uuid.uuid4().hex[:8]}"
            os.replace(final, old)
            shutil.rmtree(old)
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


class StepCheckpoints(keras.callbacks.Callback):
    """Counts the steps, checkpoints every ``every`` of them, stops at ``last``."""

    def __init__(self, folder, done, every, last, write):
        super().__init__()
        self.folder, self.done, self.every, self.last, self.write = folder, done, every, last, write

    def on_train_batch_end(self, batch, logs=None):
        self.done += 1
        if self.done % self.every == 0 or self.done >= self.last:
            if self.write:
                save_checkpoint(self.model, self.folder, self.done)
        if self.done >= self.last:
            self.model.stop_training = True


# === Devices ===
@dataclasses.dataclass
class Engine:
    """Where the model trains: the scope to build it in and how batches reach it."""

    scope: object = contextlib.nullcontext
    jit_compile: bool = True
    strategy: object = None
    replicas: int = 1
    num_hosts: int = 1
    host_index: int = 0
    is_chief: bool = True

    def dataset(self, make, batch_size, skip):
        """This host's batches: ``make(batch_size, num_shards, shard_index)``, ``skip`` steps on.

        Each host reads its own files and trains on ``batch_size / hosts``
        rows of them per step, so ``skip`` steps are ``skip`` of its batches.
        """
        if batch_size % self.replicas or batch_size % self.num_hosts:
            raise ValueError(
                f"--batch-size {batch_size} does not split evenly across {self.replicas} devices "
                f"on {self.num_hosts} host(s)."
            )
        per_host = batch_size // self.num_hosts
        dataset = make(per_host, self.num_hosts, self.host_index).skip(skip)
        if self.strategy is not None and self.num_hosts > 1:
            # tf.distribute reads a dataset's batches as global batches and takes
            # 1/hosts of each per step: hand it global-sized batches of this
            # host's rows.
            dataset = dataset.rebatch(batch_size, drop_remainder=True)
        return dataset


def engine(args):
    """The data-parallel engine of the backend (or one device)."""
    if not args.data_parallel:
        return Engine()
    if keras.config.backend() == "jax":
        import jax

        if args.coordinator_address:
            address = None if args.coordinator_address == "auto" else args.coordinator_address
            jax.distributed.initialize(address, args.num_processes, args.process_id)
        devices = keras.distribution.list_devices()
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
        )
        return Engine(
            replicas=len(devices),
            num_hosts=jax.process_count(),
            host_index=jax.process_index(),
            is_chief=jax.process_index() == 0,
        )
    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        # MultiWorkerMirroredStrategy when TF_CONFIG names a cluster, else MirroredStrategy.
        strategy = keras_masking.distribution.data_parallel_engine()
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            resolver = strategy.cluster_resolver
            cluster = resolver.cluster_spec().as_dict()
            hosts = [("chief", 0)] * ("chief" in cluster)
            hosts += [("worker", index) for index in range(len(cluster.get("worker", ())))]
            index = hosts.index((resolver.task_type, resolver.task_id))
        else:
            hosts, index = [None], 0
        return Engine(
            scope=strategy.scope,
            jit_compile=False,
            strategy=strategy,
            replicas=strategy.num_replicas_in_sync,
            num_hosts=len(hosts),
            host_index=index,
            is_chief=index == 0,
        )
    raise ValueError(f"--data-parallel supports JAX and TensorFlow, not {keras.config.backend()}.")


# === The model ===
def build_model(args, tokenizer):
    """The pretrainer (ExLM) or masked LM (MLM), compiled and built."""
    layers, hidden, heads, ffn = MODEL_SIZES[args.model_size]
    position = "rotary2d" if args.objective == "exlm" else "absolute"
    backbone = keras_masking.models.TransformerBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=layers,
        num_heads=heads,
        hidden_dim=hidden,
        intermediate_dim=ffn,
        dropout=0.1,
        max_sequence_length=args.sequence_length,
        position=position,
        custom_position_ids=position == "rotary2d",
    )
    optimizer = keras_masking.optimizers.AdamW(learning_rate=args.learning_rate, weight_decay=0.01)
    shape = (None, args.sequence_length)
    if args.objective == "exlm":
        model = keras_masking.models.ExLMPretrainer(
            backbone,
            k=args.k,
            mask_token_id=tokenizer.mask_token_id,
            unselectable_token_ids=(tokenizer.cls_token_id, tokenizer.sep_token_id),
            transition_heads=heads,
            seed=args.seed,
        )
        model.build({"token_ids": shape, "segment_ids": shape, "padding_mask": shape})
        model.compile(optimizer=optimizer, jit_compile=args.jit_compile)
    else:
        model = keras_masking.models.TransformerMaskedLM(backbone)
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(
                from_logits=True,
                reduction="mean_with_sample_weight",  # per masked token, as BERT
            ),
            weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            jit_compile=args.jit_compile,
        )
    # Every variable exists before a checkpoint is loaded into it.
    model.optimizer.build(model.trainable_variables)
    return model, backbone


def main(argv=None, callbacks=()):
    """Runs the pretraining; ``callbacks`` are extra Keras callbacks for ``fit``."""
    args = parse_args(argv)
    places = engine(args)
    args.jit_compile = places.jit_compile and not args.no_jit_compile
    if args.checkpoint_dir:
        folder = pathlib.Path(args.checkpoint_dir)
    else:
        folder = pathlib.Path(tempfile.mkdtemp(prefix="pretrain_text_shards-"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.files:
        files = text_shard_files(args.files)
        vocab = args.vocab
    else:
        files, default_vocab = default_corpus(folder / "corpus")
        vocab = args.vocab or default_vocab
    settings = run_settings(args, files, vocab)
    if places.is_chief:
        check_same_run(folder, settings)
    done = steps_done(folder)
    if done >= args.steps and (folder / BACKBONE / "config.json").is_file():
        print(f"{folder}: already trained {done} steps (--steps {args.steps}); nothing to do.")
        return 0

    keras.utils.set_random_seed(args.seed)
    tokenizer = bert_tokenizer(vocab)
    with places.scope():
        model, backbone = build_model(args, tokenizer)
        if done:
            load_checkpoint(model, folder)
            print(f"{folder}: resuming after step {done} of {args.steps}.")

    def make(batch_size, num_shards, shard_index):
        return text_shard_dataset(
            files,
            tokenizer,
            args.sequence_length,
            batch_size,
            objective=args.objective,
            shuffle_buffer=args.shuffle_buffer,
            seed=args.seed,
            num_shards=num_shards,
            shard_index=shard_index,
        )

    last = min(args.steps, args.stop_after or args.steps)
    if done < last:
        every = args.steps_per_checkpoint
        checkpoints = StepCheckpoints(folder, done, every, last, write=places.is_chief)
        # One epoch per checkpoint interval; the callback stops at the last step.
        model.fit(
            places.dataset(make, args.batch_size, skip=done),
            steps_per_epoch=every,
            epochs=math.ceil(args.steps / every),
            initial_epoch=done // every,
            callbacks=[checkpoints, *callbacks],
            shuffle=False,
            verbose=1,
        )
        done = checkpoints.done
    if done < args.steps:
        print(f"{folder}: stopped after step {done} of {args.steps}; rerun to continue.")
        return 0
    if places.is_chief:
        preset = save_backbone(backbone, tokenizer, folder)
        print(f"{folder}: trained {done} steps; backbone preset saved to {preset}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
