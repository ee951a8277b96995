"""Frozen configuration decoded from configs/*.toml; building one does no I/O beyond reading the file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import msgspec

from runtime.gate import GateConfig

SchedulerMode = Literal["serial", "mtp_batch", "hyper"]
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def doc(kind, text: str):
    """A field's type with its description: the one place `metrale serve --help` reads it from."""
    return Annotated[kind, msgspec.Meta(description=text)]


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    host: doc(str, "address to listen on") = "127.0.0.1"
    port: doc(int, "port to listen on") = 8000
    max_body_bytes: doc(int, "largest request body or WebSocket message accepted (bytes)") = 1 << 20
    ws_max_open: doc(int, "requests open at once on one WebSocket") = 64
    api_key: doc(str | None, "Bearer key every route but /health requires (unset: METRALE_API_KEY; "
                             "unset there too: no auth)") = None
    keepalive_timeout: doc(float, "a connection whose next request header is not complete this many seconds "
                                  "after it opened or its last response is closed (idle and header timeout)") = 60.0
    slow_client_timeout: doc(float, "a streamed request whose client takes none of its output for this many "
                                    "seconds is cancelled (slow_client) and its connection closed") = 30.0
    stream_buffer_bytes: doc(int, "a streamed request's output the server buffers for its client at most (the "
                                  "socket's send buffer, and as much again above it) before a write waits") = 1 << 16
    shutdown_timeout: doc(float, "on SIGTERM, in-flight requests may finish for this many seconds; the rest "
                                 "are then cancelled (shutdown)") = 30.0
    stream_pacing: doc(bool, "streamed responses spread each burst of tokens over the measured inter-token "
                             "interval (a request's stream_pacing overrides it)") = False
    log_format: doc(Literal["json", "console"], "trace log lines as JSON or human-readable") = "json"
    trace_file: doc(str | None, "write every speculation decision to this JSONL file as it is taken "
                                "(`metrale replay` reads it)") = None


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: doc(str | None, "an mlx-lm model directory (default: SmolLM2-135M-Instruct, fetched and "
                          "converted on first use)") = None
    cache_dir: doc(str | None, "where converted models and learned tables live "
                               "(default $METRALE_CACHE or ~/.cache/metrale)") = None
    prefill_step: doc(int, "prompt tokens per prefill forward of one sequence") = 2048
    blas: doc(Literal["auto", "mkl", "openblas", "reference"],
              "the BLAS under MLX's CPU matrix products: auto times MKL and OpenBLAS once per machine "
              "and keeps the faster (runtime/blas.py)") = "auto"
    rows_kernel: doc(bool, "multiply a step's few rows by each weight matrix with metrale's kernel, built at "
                           "first use for this machine (kernels/rows_matmul.py); off: MLX's matmul") = True
    compiled_layers: doc(bool, "run each decoder layer's decode and verify work as compiled MLX graphs "
                               "(kernels/compiled_blocks.py; llama-shaped models, one machine); off: "
                               "mlx-lm's layers op by op") = True
    fused_kernels: doc(bool, "compiled layers run attention over the KV cache and the MLP's SwiGLU with "
                             "metrale's fused few-rows kernels (kernels/rows_matmul/attention.cpp, "
                             "activation.cpp; built with the rows kernel); off: MLX's ops") = True
    # mlx-lm's server keeps 10 entries; 1 GiB holds ~23k tokens of the default model's KV (46 KB each)
    prompt_cache_size: doc(int, "finished requests whose KV (and drafter state) the prompt cache keeps for "
                                "later prompts that share a prefix, at most (0: no prompt cache)") = 10
    prompt_cache_bytes: doc(int, "bytes the prompt cache's entries may hold, all told; the least recently "
                                 "used entry goes first (0: no prompt cache)") = 1 << 30
    fault_after_steps: doc(int | None, "TEST ONLY (bench load's injected fault): the model owner raises on its "
                                       "step number N, once; unset: never") = None


class AdmissionConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # Well above the active limits, so a burst queues instead of turning into 429s (bench load, 64
    # clients x 400 requests on mtp_batch: 332 rejected at 64, none at 256); max_queue_wait_s bounds
    # how long one waits (serial's p99 TTFT at 64 clients was 79 s here, the openai client waits 600 s).
    max_pending: doc(int, "requests admitted and not yet ended; beyond it a request gets 429") = 256
    max_queue_wait_s: doc(float, "a request with no first token this long after it came is cancelled "
                                 "(queue_timeout, 503)") = 300.0
    max_tokens_limit: doc(int, "the largest max_tokens a request may ask for") = 4096


class SchedulerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    mode: doc(SchedulerMode, "serial, mtp_batch (continuous batching) or hyper") = "serial"
    max_active_requests: doc(int, "requests decoding at once (mtp_batch)") = 1
    batch_wait_ms: doc(float, "an idle scheduler waits this long so a burst starts as one batch") = 0.0
    mtp_max_seqs: doc(int, "above this batch width every sequence plain-decodes") = 32
    prefill_group: doc(int, "mtp_batch: newcomers prefilled together, at most") = 8
    prefill_steps_per_chunk: doc(float, "mtp_batch: a prefill chunk costs about this many decode steps") = 4.0
    prefill_floor: doc(int, "mtp_batch: smallest prefill chunk (padded tokens)") = 256
    prefill_ceiling: doc(int, "mtp_batch: largest prefill chunk (padded tokens)") = 8192
    hyper_width_executor: doc(Literal["tree", "none"], "hyper: tree lets a speculative step verify alternative "
                                                       "drafts beside its chain where measured to pay; none: "
                                                       "width 1, the serial path") = "tree"
    hyper_max_width: doc(int, "hyper: branches of a draft tree at most (the chain and width - 1 alternatives)") = 4


class SpecConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    drafter: doc(Literal["auto", "mtp", "draft-model", "ngram", "none"],
                 "auto: the model's MTP head where one is found, else n-gram lookup") = "auto"
    draft_model: doc(str | None, "an mlx-lm model directory with the same tokenizer") = None
    mtp_head: doc(str | None, "a folder with mtp_head.safetensors and mtp_head.json") = None
    num_draft_tokens: doc(int, "K: the most drafts per sequence and step") = 3
    ngram_max: doc(int, "longest n-gram the prompt-lookup drafter matches") = 3
    mtp_gate: doc(Literal["auto", "force", "off"] | None,
                  "auto: speculate where measured to pay; force: whenever eligible; off: never "
                  "(unset: METRALE_MTP_GATE_FORCE=1 means force)") = None
    entry_pin_tokens: doc(int | None, "without a cost table, a request's first tokens speculate "
                                      "(unset: METRALE_SPEC_ENTRY_PIN, else 8)") = None
    spec_think: doc(bool | None, "speculate inside <think> (unset: METRALE_DFLASH_SPEC_THINK=1)") = None
    cost_model: doc(Literal["measured", "off"], "measured: the online controller chooses depths from "
                                                "a cost table corrected by every step") = "measured"
    cost_slack: doc(float, "tok/s the energy objective may give up for tokens per joule") = 0.1
    machine_id: doc(str | None, "this machine's identity for cost tables (default: OS, CPU model, cores)") = None
    watts_per_core: doc(float, "power of the CPU-seconds energy proxy, where no energy counter exists") = 10.0
    exploration_share: doc(float, "steps that speculate to learn may cost this share of plain decode time") = 0.01
    forced_drafts: doc(bool, "structured output: tokens the grammar forces are verified as drafts, in a "
                             "speculative step (no drafter forward) and in one sequence's plain step (one "
                             "forward for the run)") = True
    suppress_tool_call: doc(bool, "a sequence inside a <tool_call> block decodes plainly (spec/mtp_gate.md)") = False


class DistributedConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One model over the processes of an `mlx.launch` group (actors/group_owner.py, actors/follower.py)."""

    enabled: doc(bool, "serve one model split over the processes mlx.launch started: rank 0 serves HTTP and "
                       "runs every actor, the other ranks run its commands on their part of the model") = False
    parallel: doc(Literal["auto", "tensor", "pipeline"],
                  "tensor: every rank holds a slice of every layer (mlx-lm's model.shard); pipeline: each rank "
                  "holds whole layers; auto: tensor where the architecture has it and its heads divide by the "
                  "number of processes, else pipeline") = "auto"
    timeout_s: doc(float, "a command the group has not finished after this many seconds fails the group: "
                          "every in-flight request fails and /health reports it (a rank died or hangs)") = 60.0
    heartbeat_s: doc(float, "an idle rank 0 checks the other ranks this often (seconds)") = 1.0


class ActorsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Each actor's inbox bound: how many messages may wait before a sender waits too."""

    owner_inbox: doc(int, "model owner's inbox bound (messages)") = 64
    drafter_inbox: doc(int, "drafter's inbox bound (messages)") = 64
    verifier_inbox: doc(int, "verifier's inbox bound (messages)") = 64
    scheduler_inbox: doc(int, "scheduler's inbox bound (messages)") = 1024
    admission_inbox: doc(int, "admission's inbox bound (messages)") = 1024
    streamer_inbox: doc(int, "streamer's inbox bound (messages)") = 4096
    telemetry_inbox: doc(int, "telemetry's inbox bound (messages)") = 8192


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    server: ServerConfig = ServerConfig()
    model: ModelConfig = ModelConfig()
    admission: AdmissionConfig = AdmissionConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    spec: SpecConfig = SpecConfig()
    gate: GateConfig = GateConfig()
    distributed: DistributedConfig = DistributedConfig()
    actors: ActorsConfig = ActorsConfig()


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
    config = override(config, "server", api_key=config.server.api_key or env.get("METRALE_API_KEY") or None)
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
    if min(msgspec.structs.astuple(config.actors)) < 1:
        raise ConfigError("every actor's inbox bound (--*-inbox) must be at least 1")
    if sched.max_active_requests < 1:
        raise ConfigError("--max-active-requests must be at least 1")
    if sched.mtp_max_seqs < 1:
        raise ConfigError("mtp_max_seqs must be at least 1")
    if sched.batch_wait_ms < 0:
        raise ConfigError("--batch-wait-ms must not be negative")
    if sched.mode == "hyper":
        _check_hyper(sched)
    if sched.mode == "serial" and sched.max_active_requests > 1:
        raise ConfigError(f"--scheduler-mode {sched.mode} admits one request at a time: "
                          f"--max-active-requests must be 1, not {sched.max_active_requests}")
    if not 1 <= sched.hyper_max_width <= 16:
        raise ConfigError("--hyper-max-width must be in 1..16")
    if adm.max_pending < 1 or adm.max_tokens_limit < 1 or config.server.ws_max_open < 1:
        raise ConfigError("admission limits must be at least 1")
    server = config.server
    if min(server.keepalive_timeout, server.slow_client_timeout) <= 0 or server.shutdown_timeout < 0:
        raise ConfigError("--keepalive-timeout and --slow-client-timeout must be positive, "
                          "--shutdown-timeout not negative")
    if server.stream_buffer_bytes < 4096:
        raise ConfigError("--stream-buffer-bytes must be at least 4096")
    if server.api_key is not None and not server.api_key.strip():
        raise ConfigError("--api-key must not be empty")
    if min(config.model.prompt_cache_size, config.model.prompt_cache_bytes) < 0:
        raise ConfigError("--prompt-cache-size and --prompt-cache-bytes must not be negative (0 turns it off)")
    if config.model.fault_after_steps is not None and config.model.fault_after_steps < 1:
        raise ConfigError("--fault-after-steps must be at least 1")
    if adm.max_queue_wait_s <= 0:
        raise ConfigError("--max-queue-wait-s must be positive")
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
    group = config.distributed
    if not 0 < group.heartbeat_s < group.timeout_s:
        raise ConfigError("--group-heartbeat-s must be positive and below --group-timeout-s")
    if group.enabled and sched.mode == "hyper":
        raise ConfigError("--distributed serves --scheduler-mode serial or mtp_batch; hyper's draft trees are "
                          "verified by a single process only")
    if group.enabled and config.model.fault_after_steps is not None:
        raise ConfigError("--fault-after-steps (test only) injects its fault into a single-process owner: "
                          "not with --distributed")
    if config.spec.drafter == "draft-model" and not config.spec.draft_model:
        raise ConfigError("--drafter draft-model needs --draft-model PATH")
    return config


BATCH_ONLY = ("prefill_group", "prefill_steps_per_chunk", "prefill_floor", "prefill_ceiling")


def _check_hyper(sched: SchedulerConfig) -> None:
    """spec/hyper.md's single-request contract: one request in the model at a time, no gather window,
    no batch settings (a queue still takes many clients, served one at a time in arrival order)."""
    if sched.max_active_requests > 1:
        raise ConfigError(f"--scheduler-mode hyper admits one request at a time (its admission cap is 1; "
                          f"other clients wait in the queue): --max-active-requests must be 1, "
                          f"not {sched.max_active_requests}")
    if sched.batch_wait_ms > 0:
        raise ConfigError(f"--scheduler-mode hyper never holds a gather window: --batch-wait-ms must be 0, "
                          f"not {sched.batch_wait_ms:g}")
    defaults = SchedulerConfig()
    changed = ["--" + f.replace("_", "-") for f in BATCH_ONLY if getattr(sched, f) != getattr(defaults, f)]
    if changed:
        raise ConfigError(f"--scheduler-mode hyper builds no batches: {', '.join(changed)} "
                          f"{'applies' if len(changed) == 1 else 'apply'} to --scheduler-mode mtp_batch only")
