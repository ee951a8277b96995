"""metrale command line: serve, bench NAME, calibrate, train-mtp STAGE, replay TRACE, fetch-model."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import pkgutil
import sys
from pathlib import Path

from runtime.config import Config, ConfigError, load_config, preset, with_environment
from runtime.config_flags import add_config_flags, apply_flags


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own_kernels()
    if argv[:1] == ["bench"]:
        return bench(argv[1:])
    if argv[:1] == ["calibrate"]:
        rest = select_blas_from(argv[1:])
        from runtime.calibrate import main as calibrate

        return calibrate(rest)
    if argv[:1] == ["train-mtp"]:
        return train_mtp(argv[1:])
    if argv[:1] == ["replay"]:
        from runtime.replay_cli import main as replay

        return replay(argv[1:])
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"metrale: {e}", file=sys.stderr)
        return 2


def own_kernels() -> None:
    """Stop with the fix where another distribution's top-level `kernels` (Hugging Face's, which
    transformers 5.25 requires) would be imported instead of the project's kernels/."""
    import importlib.util

    ours = Path(__file__).resolve().parents[1] / "kernels"
    spec = importlib.util.find_spec("kernels")
    found = Path(spec.origin).resolve().parent if spec is not None and spec.origin else None
    if found != ours:
        raise SystemExit(f"metrale: the package 'kernels' at {found} shadows metrale's {ours}; "
                         "remove it (`pip uninstall kernels`; transformers>=5.25 pulls it in)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metrale", description=__doc__)
    sub = parser.add_subparsers(required=True, dest="command")
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API",
                           description="Every setting of runtime/config.py is a flag; a flag overrides the TOML.")
    serve.add_argument("--config", help="a TOML file, or a preset name (default, serial, mtp_batch, hyper)")
    add_config_flags(serve)
    serve.set_defaults(func=cmd_serve)
    fetch = sub.add_parser("fetch-model", help="fetch and convert the default model, print its directory")
    fetch.add_argument("--cache-dir")
    fetch.set_defaults(func=cmd_fetch)
    sub.add_parser("bench", help="run a benchmark: metrale bench NAME --help")
    sub.add_parser("calibrate", help="measure verify/draft costs for the planner: metrale calibrate --help")
    sub.add_parser("train-mtp", help="build data, train or evaluate an MTP head: metrale train-mtp STAGE --help")
    sub.add_parser("replay", help="re-run the speculation policies over a decision trace: metrale replay --help")
    return parser


# The MTP-head pipeline's stages, each a module of kernels/ with its own arguments.
TRAIN_STAGES = {"data": "kernels.mtp_data", "train": "kernels.mtp_train", "eval": "kernels.mtp_eval",
                "ship": "kernels.mtp_ship"}


def train_mtp(argv: list[str]) -> int:
    if not argv or argv[0] not in TRAIN_STAGES:
        print(f"usage: metrale train-mtp STAGE [options]; STAGE is one of: {', '.join(TRAIN_STAGES)} "
              "(data: the base model's own answers and hidden states; train: the head; eval: acceptance; "
              "ship: float16, cut vocabulary, record)",
              file=sys.stderr)
        return 2
    importlib.import_module(TRAIN_STAGES[argv[0]]).main(argv[1:])
    return 0


def config_from_args(args) -> Config:
    path = args.config
    if path and not Path(path).exists():
        path = preset(path)
    return with_environment(apply_flags(load_config(path), args))


def resolve_model(config: Config) -> Path:
    if config.model.path:
        path = Path(config.model.path).expanduser()
        if not (path / "config.json").exists():
            raise ConfigError(f"--model {path}: not an mlx-lm model directory (no config.json)")
        return path
    from kernels.default_model import ensure_default_model

    return ensure_default_model(config.model.cache_dir)


def cmd_serve(args) -> int:
    config = config_from_args(args)
    from runtime.blas import select_blas

    select_blas(config.model.blas)  # before anything imports mlx
    from runtime import tracing
    from runtime.modes import make_mode

    tracing.configure(config.server.log_format)
    make_mode(config.scheduler)  # an unavailable mode fails here, before the model is fetched
    rank = group_rank(config)
    model_dir = resolve_in_turn(config, rank)
    if rank > 0:  # a follower: rank 0's commands on this rank's part of the model, no server
        from actors.follower import follow

        _exit(as_rank(lambda: follow(config, model_dir)))
    from runtime.server import serve
    from runtime.system import System

    run = lambda: asyncio.run(_serve(System, serve, config, model_dir)) or 0  # noqa: E731
    _exit(as_rank(run) if config.distributed.enabled else run())


def as_rank(run) -> int:
    """A distributed rank's part, after which the process exits at once whatever happened: its
    owner thread may be blocked in a collective for good, and a normal exit would wait for it."""
    try:
        return run()
    except ConfigError as e:
        code, text = 2, f"metrale: {e}"
    except BaseException:  # noqa: BLE001  (reported, then the exit)
        import traceback

        code, text = 1, traceback.format_exc()
    try:
        print(text, file=sys.stderr)
    except OSError:  # the launcher that read stderr may be gone
        pass
    return code


def _exit(code: int) -> None:
    # Every request has ended and every actor has stopped. Skip the interpreter's teardown: MLX's
    # per-thread stream workers can abort it ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def resolve_in_turn(config: Config, rank: int) -> Path:
    """The model directory; in a group rank 0 fetches (or converts) first and the others after it,
    so ranks sharing one machine never convert into the same folder at once."""
    if not config.distributed.enabled:
        return resolve_model(config)
    from kernels.group import barrier

    model_dir = resolve_model(config) if rank == 0 else None
    barrier()
    return model_dir or resolve_model(config)


def group_rank(config: Config) -> int:
    """This process's rank in the mlx.launch group (0 when not distributed); a clear error where
    --distributed finds no group of two or more processes."""
    if not config.distributed.enabled:
        return 0
    from kernels.group import GroupLost, init_group

    try:
        group = init_group()
    except GroupLost as e:
        raise ConfigError(f"--distributed: {e}, e.g. `mlx.launch --backend ring -n 2 -- metrale serve "
                          f"--distributed` (README: several machines)") from None
    if group.size() < 2:
        raise ConfigError("--distributed: this process is alone in its group; start two or more with mlx.launch")
    return group.rank()


async def _serve(system_cls, serve, config, model_dir) -> None:
    await serve(system_cls(config, model_dir), config)


def cmd_fetch(args) -> int:
    from runtime.blas import select_blas

    select_blas()
    from kernels.default_model import ensure_default_model

    print(ensure_default_model(args.cache_dir))
    return 0


def bench_names() -> list[str]:
    import runtime.bench as pkg

    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))


def bench(argv: list[str]) -> int:
    names = bench_names()
    if not argv or argv[0] not in names:
        print(f"usage: metrale bench NAME [options]; NAME is one of: {', '.join(names)}", file=sys.stderr)
        return 2
    rest = select_blas_from(argv[1:])
    module = importlib.import_module(f"runtime.bench.{argv[0].replace('-', '_')}")
    return module.main(rest)


def select_blas_from(argv: list[str]) -> list[str]:
    """Benchmarks and calibrate take serve's --blas too: the BLAS is loaded before mlx, so before
    the command's own arguments are read; returns the rest of argv."""
    from runtime.blas import select_blas

    parser = argparse.ArgumentParser(add_help=False)
    add_config_flags(parser, only=("model", "blas"))
    known, rest = parser.parse_known_args(argv)
    select_blas(known.cfg__model__blas or "auto")
    return rest


if __name__ == "__main__":
    sys.exit(main())
