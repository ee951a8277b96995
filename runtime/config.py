"""Frozen configuration decoded from configs/*.toml; building one does no I/O beyond reading the file."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

SchedulerMode = Literal["serial", "mtp_batch", "hyper"]
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 1 << 20
    log_format: Literal["json", "console"] = "json"


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: str | None = None  # None: the default model, fetched and converted on first use
    cache_dir: str | None = None  # None: $METRALE_CACHE or ~/.cache/metrale
    prefill_step: int = 2048


class AdmissionConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    max_pending: int = 64  # admitted and not yet ended; beyond it a request gets 429
    max_tokens_limit: int = 4096


class SchedulerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    mode: SchedulerMode = "serial"
    max_active_requests: int = 1
    batch_wait_ms: float = 0.0
    mtp_max_seqs: int = 32  # above this batch width every sequence plain-decodes (the planner's cap too)


class SpecConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # auto: the model's MTP head where one is found, else n-gram lookup
    drafter: Literal["auto", "mtp", "draft-model", "ngram", "none"] = "auto"
    draft_model: str | None = None
    mtp_head: str | None = None  # a folder with mtp_head.safetensors + mtp_head.json
    num_draft_tokens: int = 3
    ngram_max: int = 3
    mtp_gate: Literal["auto", "force", "off"] | None = None  # None: METRALE_MTP_GATE_FORCE, else auto
    entry_pin_tokens: int | None = None  # None: METRALE_SPEC_ENTRY_PIN, else 8 (the gate's entry pin)
    spec_think: bool | None = None  # speculate inside <think>; None: METRALE_DFLASH_SPEC_THINK=1
    cost_model: Literal["measured", "off"] = "measured"  # draft depth from a calibration table, if one exists
    cost_slack: float = 0.1  # tok/s may fall this far below depth 1's for a better tokens per joule
    machine_id: str | None = None  # None: this machine's (OS, CPU model, cores); names whose tables are native
    watts_per_core: float = 10.0  # the CPU-seconds energy proxy's power, where no energy counter exists
    exploration_share: float = 0.01  # speculative steps run to learn may cost this share of plain decode time


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    server: ServerConfig = ServerConfig()
    model: ModelConfig = ModelConfig()
    admission: AdmissionConfig = AdmissionConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    spec: SpecConfig = SpecConfig()


class ConfigError(ValueError):
    """A configuration that cannot be served; the message names the setting."""


def load_config(path: Path | str | None = None) -> Config:
    path = Path(path) if path else CONFIG_DIR / "default.toml"
    try:
        config = msgspec.toml.decode(path.read_bytes(), type=Config)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{path}: {e}") from None
    return validate(config)


def with_environment(config: Config, env=None) -> Config:
    """Fill the settings the spec lets environment variables give, once, where Config left them
    unset; nothing past configuration reads the environment."""
    import os

    from runtime.eligibility import entry_pin_tokens_from_env, gate_setting, spec_think_from_env

    env = os.environ if env is None else env
    spec = config.spec
    return override(config, "spec", mtp_gate=gate_setting(spec.mtp_gate, env).value,
                    entry_pin_tokens=entry_pin_tokens_from_env(env) if spec.entry_pin_tokens is None else None,
                    spec_think=spec_think_from_env(env) if spec.spec_think is None else None)


def preset(name: str) -> Path:
    path = CONFIG_DIR / f"{name}.toml"
    if not path.exists():
        raise ConfigError(f"no preset {name!r} in {CONFIG_DIR}")
    return path


def override(config: Config, section: str, **changes) -> Config:
    """A copy of config with some fields of one section replaced (None values are ignored)."""
    changes = {k: v for k, v in changes.items() if v is not None}
    if not changes:
        return config
    part = msgspec.structs.replace(getattr(config, section), **changes)
    return validate(msgspec.structs.replace(config, **{section: part}))


def validate(config: Config) -> Config:
    sched, adm = config.scheduler, config.admission
    if sched.max_active_requests < 1:
        raise ConfigError("--max-active-requests must be at least 1")
    if sched.mtp_max_seqs < 1:
        raise ConfigError("mtp_max_seqs must be at least 1")
    if sched.batch_wait_ms < 0:
        raise ConfigError("--batch-wait-ms must not be negative")
    if sched.mode in ("serial", "hyper") and sched.max_active_requests > 1:
        raise ConfigError(f"--scheduler-mode {sched.mode} admits one request at a time: "
                          f"--max-active-requests must be 1, not {sched.max_active_requests}")
    if adm.max_pending < 1 or adm.max_tokens_limit < 1:
        raise ConfigError("admission limits must be at least 1")
    if not 1 <= config.spec.num_draft_tokens <= 16:
        raise ConfigError("--num-draft-tokens must be in 1..16")
    if not 0.0 <= config.spec.cost_slack < 1.0:
        raise ConfigError("--spec-cost-slack must be in [0, 1)")
    if config.spec.entry_pin_tokens is not None and config.spec.entry_pin_tokens < 0:
        raise ConfigError("--entry-pin-tokens must not be negative")
    if not 0.0 <= config.spec.exploration_share <= 0.5:
        raise ConfigError("--exploration-share must be in [0, 0.5]")
    if config.spec.watts_per_core <= 0:
        raise ConfigError("--watts-per-core must be positive")
    if config.spec.drafter == "draft-model" and not config.spec.draft_model:
        raise ConfigError("--drafter draft-model needs --draft-model PATH")
    return config
