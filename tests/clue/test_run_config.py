"""RunConfig: one run's settings, checked once, shared by finetune, compare and the commands."""

import dataclasses

import keras
import pytest

from keras_masking import cli
from keras_masking.clue.method_plan import MethodPlan
from keras_masking.clue.run_config import RunConfig


def test_options_split_into_settings_and_methods():
    config = RunConfig.from_options(preset="p", epochs=3, fl_tuning=160, drop_token=0.1)
    assert (config.preset, config.epochs) == ("p", 3)
    assert config.methods == MethodPlan(fl_tuning=160, drop_token=0.1)
    # Options change a given config; the rest is kept.
    changed = RunConfig.from_options(config, seed=4, lora=0)
    assert (changed.seed, changed.epochs, changed.methods.fl_tuning) == (4, 3, 160)
    assert RunConfig(methods={"asa": 0.5}).methods == MethodPlan(asa=0.5)


@pytest.mark.parametrize("methods", [{"fl_tuning": 8}, MethodPlan(fl_tuning=8)])
def test_switches_given_with_methods_add_to_them(methods):
    """`finetune(methods={"fl_tuning": 8}, drop_token=0.1)` dropped `methods`:
    the run fine-tuned the whole model with DropToken, without FL-tuning."""
    config = RunConfig.from_options(preset="p", methods=methods, drop_token=0.1, fl_tuning=8)
    assert config.methods == MethodPlan(fl_tuning=8, drop_token=0.1)
    base = RunConfig.from_options(preset="p", lora=4)
    assert RunConfig.from_options(base, methods={"asa": 0.5}, seed=1).methods == MethodPlan(asa=0.5)
    with pytest.raises(ValueError, match=r"\['fl_tuning'\] are set twice.*8.*16"):
        RunConfig.from_options(preset="p", methods=methods, fl_tuning=16)


def test_resolved_fills_the_tasks_defaults_and_keeps_what_was_given():
    config = RunConfig(epochs=2).resolved("tnews")
    assert config.epochs == 2
    assert (config.batch_size, config.learning_rate, config.max_length, config.accumulation) == (
        32, 2e-5, 128, 1,
    )  # fmt: skip
    assert config.training_record() == {
        "epochs": 2, "batch_size": 32, "learning_rate": 2e-5, "max_length": 128,
        "accumulation": 1, "warmup_proportion": 0.1, "weight_decay": 0.01, "seed": 0,
    }  # fmt: skip


@pytest.mark.parametrize(
    "options, message",
    [
        ({"epochs": 0}, r"Expected an integer >= 1 for epochs. Received: epochs=0"),
        ({"batch_size": 2.5}, r"Expected an integer for batch_size"),
        ({"max_length": 4}, r"max_length"),
        ({"learning_rate": 0.0}, r"learning_rate"),
        ({"learning_rate": float("nan")}, r"learning_rate"),
        ({"warmup_proportion": 1.0}, r"warmup_proportion"),
        ({"weight_decay": -1.0}, r"weight_decay"),
        ({"seed": -1}, r"seed"),
        ({"seed": 99999999999}, r"seed"),
        ({"jit_compile": "yes"}, r"jit_compile"),
        ({"data_parallel": 1.0}, r"data_parallel"),
        ({"model": "gpt"}, r"Expected model in \['bert', 'roberta', 'roformer', 'nezha'\]"),
        ({"benchmark": "glue"}, r"benchmark"),
        ({"few_shot": 5}, r"few_shot"),
        ({"few_shot": "some"}, r"few_shot"),
        ({"dev_noise": 1.5}, r"dev_noise in \[0.0, 1.0\]"),
        ({"preset": 3}, r"Expected a path for preset"),
        ({"methods": ["fl_tuning"]}, r"Expected a MethodPlan or a dict"),
        ({"fl_tuning": -1}, r"fl_tuning"),
    ],
)
def test_bad_values_are_refused_naming_the_setting(options, message):
    with pytest.raises(ValueError, match=message):
        RunConfig.from_options(**options)


def test_unknown_options_are_refused_naming_the_known_ones():
    with pytest.raises(TypeError, match=r"Unknown run settings \['bogus'\].*epochs.*fl_tuning"):
        RunConfig.from_options(bogus=1)
    with pytest.raises(TypeError, match="Expected a RunConfig for run_config"):
        RunConfig.from_options({"epochs": 1})


@pytest.mark.parametrize(
    "task, options, message",
    [
        ("tnews", {"exlm_k": 2, "drop_token": 0.1}, r"--exlm-k and --drop-token do not combine"),
        ("cluener", {"asa": 0.5}, r"--asa does not apply to cluener"),
        ("cmrc2018", {"dev_noise": 0.1}, r"dev_noise applies to text classification"),
    ],
)
def test_resolved_checks_the_tasks_rules(task, options, message):
    config = RunConfig.from_options(**options)  # fine on its own
    with pytest.raises(ValueError, match=message):
        config.resolved(task)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="a TensorFlow-only limit")
def test_accumulation_data_parallel_is_refused_on_tensorflow():
    with pytest.raises(ValueError, match=r"accumulation=2 cannot run data parallel"):
        RunConfig(accumulation=2, data_parallel=True).resolved("tnews")
    RunConfig(accumulation=1, data_parallel=True).resolved("tnews")


def test_a_run_record_gives_back_its_config():
    config = RunConfig.from_options(
        preset="/p", epochs=2, batch_size=4, learning_rate=1e-3, max_length=16, seed=3,
        few_shot=1, dev_noise=0.2, fl_tuning=8, drop_token=0.1,
    ).resolved("eprstmt")  # fmt: skip
    arguments = {  # as finetune records them
        "task": "eprstmt", "benchmark": None, "few_shot": 1, "data_dir": "/d", "checkpoint": None,
        "preset": "/p", "model": None, "config": None, "vocab": None, "stride": None,
        "dev_noise": 0.2, **config.methods.describe(), **config.training_record(),
    }  # fmt: skip
    assert RunConfig.from_record(arguments) == config


def _parsed(argv):
    return cli._run_config(cli.build_parser().parse_args(argv))


def test_the_command_line_flags_are_the_configs_fields():
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    flags = {name: {opt for a in commands[name]._actions for opt in a.option_strings}
             for name in ("clue", "compare")}  # fmt: skip
    for field in dataclasses.fields(RunConfig):
        if not field.metadata:
            continue
        for command in ("clue", "compare"):
            has = field.metadata["flag"] in flags[command]
            assert has == (command in field.metadata["commands"]), (field.name, command)
    for flag in ("--drop-token", "--asa", "--fl-tuning", "--prefix-tuning", "--lora",
                 "--exlm-k", "--correct-embeddings"):  # fmt: skip
        assert flag in flags["clue"] and flag not in flags["compare"]


def test_clue_and_compare_read_the_same_flags_into_the_same_config():
    shared = ["--preset", "p", "--epochs", "2", "--batch-size", "4", "--lr", "1e-3",
              "--max-length", "16", "--accumulation", "2", "--warmup", "0.2",
              "--weight-decay", "0", "--benchmark", "fewclue", "--few-shot", "1",
              "--dev-noise", "0.1", "--no-jit-compile", "--data-parallel"]  # fmt: skip
    clue = _parsed(["clue", "tnews", "data", "out", *shared, "--fl-tuning", "8", "--seed", "3"])
    compare = _parsed(["compare", "tnews", "data", "out", *shared, "--methods", "plain"])
    expected = RunConfig(
        preset="p", epochs=2, batch_size=4, learning_rate=1e-3, max_length=16, accumulation=2,
        warmup_proportion=0.2, weight_decay=0.0, benchmark="fewclue", few_shot=1,
        dev_noise=0.1, jit_compile=False, data_parallel=True,
    )  # fmt: skip
    assert compare == expected
    assert clue == dataclasses.replace(expected, seed=3, methods=MethodPlan(fl_tuning=8))
    assert _parsed(["clue", "tnews", "data", "out", "--preset", "p"]) == RunConfig(preset="p")


@pytest.mark.parametrize("command", ["clue", "compare"])
def test_a_bad_flag_value_is_a_usage_error_with_the_configs_message(command, capsys):
    extra = ["--methods", "plain"] if command == "compare" else []
    code = cli.main([command, "tnews", "d", "o", "--preset", "p", "--epochs", "0", *extra])
    assert code == 2
    assert "Expected an integer >= 1 for epochs. Received: epochs=0" in capsys.readouterr().err


def test_a_batch_size_the_replicas_do_not_divide_is_refused(monkeypatch):
    # Two replicas in scope (the two-device run: tests/distribution/test_distribution.py).
    from keras_masking.clue import run_config

    monkeypatch.setattr(run_config, "replicas_in_sync", lambda engine=None: 2)
    with pytest.raises(ValueError, match=r"batch_size that the 2 data-parallel replicas divide"):
        RunConfig(batch_size=3).resolved("tnews")
    assert RunConfig(batch_size=4).resolved("tnews").batch_size == 4
    # The task's default batch size is checked too (CMRC2018's is 4).
    monkeypatch.setattr(run_config, "replicas_in_sync", lambda engine=None: 3)
    with pytest.raises(ValueError, match=r"Received: batch_size=4 for task 'cmrc2018'"):
        RunConfig().resolved("cmrc2018")
