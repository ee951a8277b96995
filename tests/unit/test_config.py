"""Config is the one place for each setting: TOML presets and serve flags are derived from it."""

import argparse

import pytest

from runtime.cli import _parser, config_from_args
from runtime.config import CONFIG_DIR, ConfigError, load_config
from runtime.config_flags import config_fields, flag_name


def serve_parser() -> argparse.ArgumentParser:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def test_every_config_field_has_one_flag_and_every_flag_one_field():
    flags = {opt for action in serve_parser()._actions for opt in action.option_strings}
    expected = {flag_name(section, field.name) for section, field in config_fields()}
    assert len(expected) == len(config_fields())  # no two fields share a flag
    negations = {"--no-" + f[2:] for f in expected}  # a boolean field's flag comes with its --no- form
    assert flags - {"-h", "--help", "--config"} - negations == expected


def test_help_lists_every_field_with_its_description():
    text = " ".join(serve_parser().format_help().split())
    for section, field in config_fields():
        assert f"[{section}.{field.name}, default" in text


def test_flags_override_the_toml_and_unset_flags_keep_it():
    args = _parser().parse_args(["serve", "--config", "mtp_batch", "--num-draft-tokens", "2",
                                 "--gate-margin", "0.1", "--no-spec-think", "--machine-id", "other cpu"])
    config = config_from_args(args)
    assert config.scheduler.mode == "mtp_batch" and config.scheduler.max_active_requests == 32
    assert config.spec.num_draft_tokens == 2 and config.gate.margin == 0.1
    assert config.spec.spec_think is False and config.spec.machine_id == "other cpu"


def test_bad_values_name_their_flag():
    with pytest.raises(ConfigError, match="--exploration-share"):
        config_from_args(_parser().parse_args(["serve", "--exploration-share", "0.9"]))


def test_every_preset_loads():
    for path in CONFIG_DIR.glob("*.toml"):
        load_config(path)
