"""`metrale serve` flags, generated from Config: every field has one flag, every flag one field.

A flag is the field's name (`num_draft_tokens` -> `--num-draft-tokens`); sections in PREFIXED add
their name (`gate.margin` -> `--gate-margin`), and RENAMED keeps a few names users already type.
Help text is the field's description in runtime/config.py. Unset flags leave the TOML's value.
"""

from __future__ import annotations

import argparse
import enum

import msgspec
import msgspec.inspect as mi

from runtime.config import Config, override

RENAMED = {("model", "path"): "model", ("scheduler", "mode"): "scheduler-mode",
           ("spec", "cost_model"): "spec-cost-model", ("spec", "cost_slack"): "spec-cost-slack",
           ("distributed", "enabled"): "distributed", ("distributed", "timeout_s"): "group-timeout-s",
           ("distributed", "heartbeat_s"): "group-heartbeat-s"}
PREFIXED = frozenset({"gate"})  # names like `margin` alone would not say what they set


def config_fields() -> list[tuple[str, mi.Field]]:
    """(section, field) for every field of every Config section."""
    return [(section.name, field) for section in mi.type_info(Config).fields for field in section.type.fields]


def flag_name(section: str, field: str) -> str:
    if (section, field) in RENAMED:
        return "--" + RENAMED[section, field]
    name = f"{section}_{field}" if section in PREFIXED else field
    return "--" + name.replace("_", "-")


def add_config_flags(parser: argparse.ArgumentParser, only: tuple[str, str] | None = None) -> None:
    """Every Config field's flag, or with `only` (section, field) that one flag alone."""
    for section, field in config_fields():
        if only is not None and (section, field.name) != only:
            continue
        kind, text = _unwrap(field.type)
        options = {"dest": f"cfg__{section}__{field.name}", "default": None,
                   "help": f"{text} [{section}.{field.name}, default {_shown(field.default)}]"}
        arg = _argument_kind(kind)
        if "choices" not in arg and "action" not in arg:
            options["metavar"] = field.name.upper()
        parser.add_argument(flag_name(section, field.name), **options, **arg)


def apply_flags(config: Config, args: argparse.Namespace) -> Config:
    """config with every flag given on the command line applied."""
    changes: dict[str, dict] = {}
    for key, value in vars(args).items():
        if key.startswith("cfg__") and value is not None:
            _, section, field = key.split("__")
            changes.setdefault(section, {})[field] = value
    for section, fields in changes.items():
        config = override(config, section, **fields)
    return config


def _unwrap(kind) -> tuple[mi.Type, str]:
    text = ""
    if isinstance(kind, mi.Metadata):
        text = (kind.extra_json_schema or {}).get("description", "")
        kind = kind.type
    if isinstance(kind, mi.UnionType):  # X | None: the flag gives an X
        kind = next(t for t in kind.types if not isinstance(t, mi.NoneType))
    return kind, text


def _argument_kind(kind: mi.Type) -> dict:
    if isinstance(kind, mi.BoolType):
        return {"action": argparse.BooleanOptionalAction}
    if isinstance(kind, mi.LiteralType):
        return {"choices": list(kind.values)}
    if isinstance(kind, mi.EnumType):
        return {"choices": [m.value for m in kind.cls], "type": lambda v, cls=kind.cls: cls(v)}
    if isinstance(kind, mi.IntType):
        return {"type": int}
    if isinstance(kind, mi.FloatType):
        return {"type": float}
    if isinstance(kind, mi.StrType):
        return {"type": str}
    raise TypeError(f"no flag for a config field of type {kind}")


def _shown(default) -> str:
    if isinstance(default, enum.Enum):
        return str(default.value)
    return "unset" if default is None or default is msgspec.NODEFAULT else str(default)
