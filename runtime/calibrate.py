"""metrale calibrate: measure this machine's verify and draft costs and the drafter's acceptance.

For the loaded model and drafter it times verify(n, K) and draft(n, K) (kernels/calibrate.py) at
widths n = powers of two up to --mtp-max-seqs and depths K = 0..--max-k, then runs greedy
speculation at depth --max-k on a prompt set through the served scheduler (the actor system in
this process, serial mode, gate forced, no planner: what `metrale serve --drafter D
--num-draft-tokens K --mtp-gate force --spec-cost-model off` runs) to fit the acceptance
calibration: P(accept) of draft position t given that drafts 1..t-1 were accepted (by_depth, the
planner's prior), and for drafters with confidences, P(accept) against the top-1 log-probability.
The table (runtime/cost_table.py) goes to --out, by default the cache folder:
~/.cache/metrale/calibration/<model>-<drafter>.json.

Nothing is written until every cell is measured, and then atomically, so Ctrl-C leaves no partial
table (exit 130). A table at --out measured for another model or machine is not overwritten
without --force.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import re
import sys
from pathlib import Path
from typing import Callable, Sequence

import msgspec

from runtime.config import CONFIG_DIR
from runtime.cost_table import (
    AcceptanceCalibration, Cost, CostTable, TableMeta, machine_id, make_table, save_table,
)

SHIPPED_DIR = CONFIG_DIR / "calibration"  # example tables measured on the CI machines
_PSEUDO_TRIALS = 2  # shrinkage of each depth's acceptance toward the depth before it


class CalibrateError(Exception):
    """A calibration that cannot run as asked; the message says why."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    widths: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    max_k: int = 8
    warmup: int = 2
    repeats: int = 7
    context_tokens: int = 128  # the KV context verify runs at
    history_tokens: int = 2048  # what an n-gram lookup searches
    prompts: int = 4  # per prompt set (code, chat) for the acceptance run
    max_tokens: int = 64
    watts_per_core: float = 10.0  # the CPU-seconds proxy's power, where no counter exists
    bins: int = 8  # confidence bins of the acceptance calibration


class Workload(msgspec.Struct, frozen=True, kw_only=True):
    context: tuple[int, ...]
    history: tuple[int, ...]
    prompts: tuple[tuple[int, ...], ...]


# --- where tables live -------------------------------------------------------------------------
def model_id(model_dir: Path | str) -> str:
    """The model's directory name, less the "-f32" our converter adds (dtype is recorded apart)."""
    return re.sub(r"-f32$", "", Path(model_dir).name)


def table_name(model: str, drafter: str) -> str:
    return f"{re.sub(r'[^a-z0-9.]+', '-', model.lower()).strip('-')}-{drafter}.json"


def table_path(model: str, drafter: str, cache: str | None = None) -> Path:
    """Where calibrate writes by default: the cache folder."""
    from kernels.default_model import cache_dir

    return cache_dir(cache) / "calibration" / table_name(model, drafter)


def find_table(model: str, drafter: str, cache: str | None = None) -> Path | None:
    """The cache folder's table, else the one shipped in configs/calibration/, else None."""
    for path in (table_path(model, drafter, cache), SHIPPED_DIR / table_name(model, drafter)):
        if path.exists():
            return path
    return None


def check_target(path: Path, model: str, machine: str, force: bool) -> None:
    """Refuse to overwrite a table of another model or machine (or a file that is not a table)."""
    if force or not path.exists():
        return
    try:
        meta = msgspec.json.decode(path.read_bytes(), type=CostTable).meta
    except (msgspec.DecodeError, OSError) as exc:
        raise CalibrateError(f"{path} is not a cost table ({exc}); pass --force to overwrite it")
    for field, expected, found in (("model", model, meta.model_id), ("machine", machine, meta.machine)):
        if found != expected:
            raise CalibrateError(
                f"{path} holds a table for {field} {found!r}, not this {field} {expected!r}; "
                "pass --force to overwrite it, or choose another --out"
            )


def powers_of_two(cap: int) -> tuple[int, ...]:
    return tuple(1 << i for i in range(cap.bit_length()) if 1 << i <= cap)


# --- acceptance calibration ----------------------------------------------------------------------
def fit_calibration(steps: Sequence, max_k: int, bins: int = 8) -> AcceptanceCalibration:
    """by_depth[t-1] = P(draft t accepted | drafts 1..t-1 accepted); confidence knots likewise.

    steps: objects with confidences, drafted and accepted (runtime.sequence.StepRecord). Deep drafts
    are rarely reached, so each depth past the first adds _PSEUDO_TRIALS trials at the rate of the
    depth before it: 2 hits in 2 tries at depth 7 must not read as certainty (the planner would
    chase it).
    """
    trials, hits = [0] * max_k, [0] * max_k
    pairs: list[tuple[float, bool]] = []
    for step in steps:
        for t in range(min(step.drafted, max_k, step.accepted + 1)):  # prefix all accepted
            accepted = step.accepted > t
            trials[t] += 1
            hits[t] += accepted
            if t < len(step.confidences):
                pairs.append((step.confidences[t], accepted))
    by_depth: list[float] = []
    for t in range(max_k if trials[0] else 0):
        prior, weight = (by_depth[-1], _PSEUDO_TRIALS) if by_depth else (0.0, 0)
        by_depth.append((hits[t] + weight * prior) / (trials[t] + weight))
    confidence, acceptance = _knots(pairs, bins)
    return AcceptanceCalibration(confidence=confidence, acceptance=acceptance, by_depth=tuple(by_depth))


def _knots(pairs: list[tuple[float, bool]], bins: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """About-equal-count confidence bins -> (mean confidence, acceptance rate), strictly ascending.

    A bin closes only where the confidence changes, so equal confidences never straddle two bins.
    """
    pairs, size = sorted(pairs), max(1, -(-len(pairs) // max(1, bins)))
    groups: list[list[tuple[float, bool]]] = []
    for pair in pairs:
        if not groups or (len(groups[-1]) >= size and pair[0] != groups[-1][-1][0]):
            groups.append([])
        groups[-1].append(pair)
    xs: list[float] = []
    ys: list[float] = []
    for group in groups:
        x, y = sum(c for c, _ in group) / len(group), sum(a for _, a in group) / len(group)
        if xs and x <= xs[-1]:  # float rounding of a mean: keep the knots strictly ascending
            continue
        xs.append(x)
        ys.append(y)
    return tuple(xs), tuple(ys)


# --- measuring ---------------------------------------------------------------------------------
def measure_table(
    model, *, model_dir: Path, drafter: str, model_name: str, dtype: str, settings: Settings,
    workload: Workload, mtp_head: str | None = None, head=None, tick: Callable[[], None] = lambda: None,
    matmul: str = "stock",
) -> CostTable:
    """Every cell and the acceptance calibration; writes nothing (the caller saves the result).
    model (and head, for MTP) are timed in this thread; acceptance runs on model_dir as served."""
    import kernels
    from kernels import calibrate as kc
    from runtime.energy import open_meter

    meter = open_meter(settings.watts_per_core)
    depths = tuple(range(settings.max_k + 1))
    cells = kc.verify_cells(model, settings.widths, depths, workload.context, settings.max_k)
    verify = kc.median_cells(cells, warmup=settings.warmup, repeats=settings.repeats, meter=meter, tick=tick)
    cells = kc.draft_cells(drafter, model, head, settings.widths, depths, workload.context, workload.history)
    draft = kc.median_cells(cells, warmup=settings.warmup, repeats=settings.repeats, meter=meter, tick=tick)
    steps = acceptance_steps(model_dir, workload.prompts, drafter=drafter, mtp_head=mtp_head,
                             k=settings.max_k, max_tokens=settings.max_tokens, tick=tick)
    meta = TableMeta(
        model_id=model_name, drafter=drafter, machine=machine_id(), dtype=dtype,
        blas=f"{kernels.BLAS} | {matmul}",  # as ModelInfo.compute: what a served step runs on
        energy_source=meter.source, date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        watts_per_core=settings.watts_per_core if meter.source == "cpu_proxy" else None,
    )
    return make_table(
        meta=meta, widths=settings.widths, depths=depths,
        verify=lambda n, k: _cost(verify[n, k]),
        draft=lambda n, k: _cost(draft[n, k]) if k else Cost(ms=0.0, joules=0.0),
        calibration=fit_calibration(steps, settings.max_k, settings.bins),
    )


def acceptance_steps(model_dir: Path, prompts: Sequence[Sequence[int]], *, drafter: str,
                     mtp_head: str | None, k: int, max_tokens: int, tick: Callable[[], None]) -> list:
    """Greedy speculation at depth k on each prompt through the served scheduler; one StepRecord
    (confidences, drafted, accepted) per verify step (runtime/sequence.py record_steps). The
    confidences are there where the scheduler hands them to note_verify (else empty: no knots)."""
    return asyncio.run(_acceptance(model_dir, prompts, drafter, mtp_head, k, max_tokens, tick))


async def _acceptance(model_dir, prompts, drafter, mtp_head, k, max_tokens, tick) -> list:
    from runtime.bench._inprocess import Served, fixed_depth
    from runtime.config import load_config
    from runtime.messages import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    steps: list = []
    async with Served(fixed_depth(load_config(), drafter, k, mtp_head), model_dir) as client:
        for ids in prompts:
            steps += (await client.generate(ids, params, record=True)).steps
            tick()
    return steps


def _cost(sample) -> Cost:
    return Cost(ms=sample.ms, joules=sample.joules)


def quick_table(model_dir: Path, name: str, drafter: str, max_k: int) -> tuple[CostTable, Path]:
    """A short width-1 calibration, saved to the cache folder, for a bench that finds no table."""
    settings = Settings(widths=(1,), max_k=max_k, warmup=1, repeats=3, prompts=2, max_tokens=48)
    path = table_path(name, drafter)
    table = _measure(model_dir, name, drafter, None, settings)
    save_table(table, path)
    return table, path


def progress_total(settings: Settings, prompts: int) -> int:
    """Progress units: every timed call (verify and draft cells), plus one per acceptance prompt."""
    depths = settings.max_k + 1
    cells = len(settings.widths) * (2 * depths - 1)  # depth 0 drafts nothing
    return (settings.warmup + settings.repeats) * cells + prompts


# --- the command -------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("\nmetrale calibrate: interrupted; no table written", file=sys.stderr)
        return 130
    except (CalibrateError, FileNotFoundError) as exc:
        print(f"metrale calibrate: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="metrale calibrate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Settings()
    p.add_argument("--model", help="an mlx-lm model directory (default: SmolLM2-135M-Instruct)")
    p.add_argument("--cache-dir", help="where converted models and tables live (default ~/.cache/metrale)")
    p.add_argument("--drafter", choices=["auto", "ngram", "mtp"], default="auto",
                   help="auto: the model's MTP head where one is found, else n-gram lookup")
    p.add_argument("--mtp-head", help="a folder with mtp_head.safetensors and mtp_head.json")
    p.add_argument("--mtp-max-seqs", type=int, default=32, help="widest batch: widths are powers of two up to it")
    p.add_argument("--widths", help="comma-separated widths instead, e.g. 1,2,4,8")
    p.add_argument("--max-k", type=int, default=d.max_k)
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--repeats", type=int, default=d.repeats, help="timed calls per cell (median)")
    p.add_argument("--context-tokens", type=int, default=d.context_tokens)
    p.add_argument("--history-tokens", type=int, default=d.history_tokens)
    p.add_argument("--prompts", type=int, default=d.prompts, help="prompts per set for the acceptance run")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--watts-per-core", type=float, default=d.watts_per_core,
                   help="power of the CPU-seconds proxy, used where no energy counter exists")
    p.add_argument("--out", help="the table's path (default: the cache folder)")
    p.add_argument("--force", action="store_true", help="overwrite a table of another model or machine")
    return p


def settings_from(args) -> Settings:
    widths = tuple(int(w) for w in args.widths.split(",")) if args.widths else powers_of_two(args.mtp_max_seqs)
    if not widths or sorted(set(widths)) != list(widths) or widths[0] < 1:
        raise CalibrateError(f"widths must be positive and ascending, got {widths}")
    if args.max_k < 1 or args.repeats < 1 or args.warmup < 0:
        raise CalibrateError("--max-k and --repeats must be at least 1, --warmup at least 0")
    return Settings(
        widths=widths, max_k=args.max_k, warmup=args.warmup, repeats=args.repeats,
        context_tokens=args.context_tokens, history_tokens=args.history_tokens, prompts=args.prompts,
        max_tokens=args.max_tokens, watts_per_core=args.watts_per_core,
    )


def _run(args) -> int:
    settings = settings_from(args)
    model_dir = _model_dir(args)
    name = model_id(model_dir)
    drafter = resolve_drafter(args.drafter, model_dir, args.mtp_head)
    out = Path(args.out).expanduser() if args.out else table_path(name, drafter, args.cache_dir)
    check_target(out, name, machine_id(), args.force)  # before minutes of measuring
    table = _measure(model_dir, name, drafter, args.mtp_head, settings)
    save_table(table, out)
    print(summary(table))
    print(f"metrale calibrate: wrote {out}")
    return 0


def _model_dir(args) -> Path:
    if args.model:
        path = Path(args.model).expanduser()
        if not (path / "config.json").exists():
            raise CalibrateError(f"--model {path}: not an mlx-lm model directory (no config.json)")
        return path
    from kernels.default_model import ensure_default_model

    return ensure_default_model(args.cache_dir)


def resolve_drafter(kind: str, model_dir: Path, mtp_head: str | None) -> str:
    from kernels.heads import find_mtp_head

    found = find_mtp_head(model_dir, mtp_head) is not None
    if kind == "mtp" and not found:
        raise CalibrateError(f"--drafter mtp: no MTP head found for {model_dir} (give --mtp-head PATH)")
    return kind if kind != "auto" else ("mtp" if found else "ngram")


def _measure(model_dir: Path, name: str, drafter: str, mtp_head: str | None, settings: Settings) -> CostTable:
    from tqdm import tqdm

    from kernels.heads import build_drafter
    from kernels.loader import load
    from runtime.text import TextCodec

    loaded, codec = load(model_dir), TextCodec(model_dir)
    engine_drafter = build_drafter(drafter, loaded.model, model_dir, None, mtp_head)[1]
    workload = workload_from_text(codec, settings)
    total = progress_total(settings, len(workload.prompts))
    with tqdm(total=total, desc="metrale calibrate", unit="call", file=sys.stderr) as bar:
        return measure_table(
            loaded.model, model_dir=model_dir, drafter=drafter, model_name=name, dtype=loaded.dtype,
            settings=settings, workload=workload, mtp_head=mtp_head,
            head=getattr(engine_drafter, "head", None), tick=bar.update, matmul=loaded.matmul,
        )


def workload_from_text(codec, settings: Settings) -> Workload:
    """Context and history from the prompt sets' chat encodings; the first prompts of each set."""
    from runtime.bench.spec import prompt_set

    sets = [prompt_set(name, 1000) for name in ("code", "chat")]
    encoded = [codec.encode(codec.chat_text(chat_messages(text))) for texts in sets for text in texts]
    stream = [t for ids in encoded for t in ids]
    prompts = [codec.encode(codec.chat_text(chat_messages(t))) for texts in sets for t in texts[: settings.prompts]]
    return Workload(
        context=tuple(_cycle(stream, settings.context_tokens)),
        history=tuple(_cycle(stream, settings.history_tokens)),
        prompts=tuple(tuple(p) for p in prompts),
    )


def chat_messages(text: str) -> tuple:
    from runtime.messages import ChatMessage

    return (ChatMessage(role="user", content=text),)


def _cycle(tokens: list[int], length: int) -> list[int]:
    return [tokens[i % len(tokens)] for i in range(length)]


def summary(table: CostTable) -> str:
    """Verify ms per width and depth, and the prior, for the log."""
    lines = [f"verify ms ({table.meta.energy_source}): depth " + " ".join(f"{k:>7}" for k in table.depths)]
    for n, row in zip(table.widths, table.verify):
        lines.append(f"  width {n:>3}:      " + " ".join(f"{c.ms:7.1f}" for c in row))
    prior = " ".join(f"{p:.2f}" for p in table.calibration.by_depth) or "-"
    lines.append(f"acceptance by depth (conditional): {prior}")
    return "\n".join(lines)
