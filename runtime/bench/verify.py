"""metrale bench verify: what a plain step and a verify of K drafts cost, against the memory-bound limit.

verify(n, K) is the probe `metrale calibrate` times (kernels/calibrate.py): one target forward of n
rows of K + 1 tokens over a cached context, trimmed back after each call. Six paths, in one run:
MLX's stock ops on the system OpenBLAS (what served before), stock ops on the BLAS `--blas auto`
picks here, that BLAS with the few-rows kernel (kernels/rows_matmul.py), that with the decoder
layers compiled (kernels/compiled_blocks.py) around MLX's attention and SwiGLU, and with the fused
few-rows kernels (kernels/rows_matmul/: attention, SwiGLU, norms and RoPE) there, the kernel reading
float16 copies of the weights where each value is one exactly: the path `metrale serve` runs by
default; and that path with the kernel reading the float32 weights, paired against it. Per width,
the fused kernels' time over MLX's ops is printed too. A BLAS is bound when MLX loads, so each BLAS
runs in its own child process; the kernel and the compiled layers are swapped in and out within one,
round-robin with the stock layers. The limit is the model's bytes per step (its weights as the
kernel reads them and the cached context) over this machine's streaming read bandwidth (a buffer of
that size summed by one thread per core), read in each repeat right after the served plain step, so
plain_vs_limit is paired too: measured a minute apart, the same plain step read 1.22x and 1.56x of
the limit on a 2-core AMD EPYC.
Every ratio is the median of each repeat's own ratio (its two calls ran seconds or less apart, so
they share a shared machine's drift, which each call's own median does not): verify(n,K) over the
same path's verify(n,0), and per width the compiled layers over the path under them.
Last line: verify1_ratio (verify(1,1) / verify(1,0), served path) verify4_ratio (the same at width
4) plain_vs_limit (served plain step / the limit) plain_vs_stock (served plain step / stock OpenBLAS;
paired per repeat where the chosen BLAS is OpenBLAS, else the two processes' medians).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from runtime.bench.common import table

PATHS = ("openblas stock", "chosen stock", "chosen + rows kernel", "+ compiled layers")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="metrale bench verify", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", default="1,4")
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--breakdown", action="store_true", help="also time a step's op groups (width 1)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--limit", action="store_true", help=argparse.SUPPRESS)  # a worker reads the limit
    args = parser.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    if args.worker:
        print(json.dumps(worker(widths, args.max_k, args.repeats, args.breakdown, args.limit)))
        return 0
    return report(widths, args.max_k, args.repeats, args.breakdown)


def worker(widths: list[int], max_k: int, repeats: int, breakdown: bool, limit: bool) -> dict:
    """This process's BLAS: stock and kernel ms per (width, K), model bytes, the breakdown, and (limit)
    the memory-bound limit beside each width-1 repeat's plain step."""
    import kernels
    from kernels import compiled_blocks, rows_matmul, rows_verdict, step_profile
    from kernels.calibrate import VerifyProbe
    from kernels.cell_timer import CellTimer
    from kernels.default_model import ensure_default_model
    from kernels.loader import load

    loaded = load(ensure_default_model(), rows_kernel=False, compiled=False)
    model, context = loaded.model, CellTimer.context_of(loaded.vocab_size)
    paths = {"stock": lambda: (rows_matmul.uninstall(model), compiled_blocks.uninstall(model))}
    # Every path but "float32 weights" has the kernel read float16 copies where exact, as serving does.
    kernel = (lambda: (rows_matmul.install(model), rows_matmul.use_half_weights(True))) \
        if rows_matmul.available() else (lambda: None)
    if rows_matmul.available():
        paths["kernel"] = lambda: (kernel(), compiled_blocks.uninstall(model))
    paths["mlx ops"] = lambda: (kernel(), compiled_blocks.install(model, fused_kernels=False))
    if rows_matmul.half_weights():  # the served path, its kernel reading the float32 weights
        paths["float32 weights"] = lambda: (kernel(), compiled_blocks.install(model),
                                            rows_matmul.use_half_weights(False))
    paths["compiled"] = lambda: (kernel(), compiled_blocks.install(model))  # the served path
    ms: dict[str, dict[str, list[float]]] = {p: {} for p in paths}
    paths["compiled"]()  # the bytes per step are the served path's: its kernel reads float16 copies
    step_bytes = step_profile.step_bytes(model, len(context))
    reader, limits = StreamRead(step_bytes) if limit else None, []  # read in each width-1 repeat beside its plain step
    for width in widths:
        probe = VerifyProbe(model, width, context, max_k)
        for _ in range(repeats):  # round-robin: drift hits every path and depth alike
            for path, use in paths.items():
                use()
                for k in range(max_k + 1):  # untimed: a swap makes the compiled layers trace each shape again
                    probe(k)
                for k in range(max_k + 1):
                    started = time.perf_counter()
                    probe(k)
                    ms[path].setdefault(f"{width},{k}", []).append((time.perf_counter() - started) * 1e3)
                if reader is not None and path == "compiled" and width == 1:
                    limits.append(reader.best_ms())
    out = {"blas": kernels.BLAS, "kernel": rows_matmul.status(), "model_bytes": step_bytes,
           "limit_ms": sorted(limits)[len(limits) // 2] if limits else float("nan"),
           "plain_vs_limit": paired_median(ms["compiled"]["1,0"], limits) if limits else float("nan"),
           "ms": {p: {cell: sorted(v)[len(v) // 2] for cell, v in cells.items()} for p, cells in ms.items()}}
    # Paired ratios see through a VM's drift (here +-20% within a minute); medians of each path do not.
    out["vs_plain"] = {p: {cell: paired_median(v, cells[cell.split(",")[0] + ",0"]) for cell, v in cells.items()}
                       for p, cells in ms.items()}
    base = "kernel" if "kernel" in ms else "stock"
    out["paired_against"] = "rows kernel" if base == "kernel" else "stock"
    out["paired"] = {cell: paired_median(v, ms[base][cell]) for cell, v in ms["compiled"].items()}
    out["fused_vs_mlx"] = {cell: paired_median(v, ms["mlx ops"][cell]) for cell, v in ms["compiled"].items()}
    out["compiled_vs_stock"] = {cell: paired_median(v, ms["stock"][cell]) for cell, v in ms["compiled"].items()}
    if "float32 weights" in ms:
        out["half_vs_float32"] = {cell: paired_median(v, ms["float32 weights"][cell])
                                  for cell, v in ms["compiled"].items()}
    if rows_matmul.available():  # what routed the kernel: its time over this BLAS's at each row count
        out["kernel_vs_blas"] = rows_verdict.row_ratios(rows_matmul.products(model), repeats)
        out["kernel_win_ratio"] = rows_verdict.WIN_RATIO
    if breakdown and step_profile.supported(model):
        out["breakdown"] = {}
        for path, use in paths.items():
            use()
            out["breakdown"][path] = {rows: step_profile.profile(model, rows, context, repeats)
                                      for rows in (1, 2, 4, 9)}
    return out


def paired_median(numerators: list[float], denominators: list[float]) -> float:
    """The median of each repeat's ratio: the two calls of a repeat share the machine's drift."""
    return statistics.median(n / d for n, d in zip(numerators, denominators, strict=True))


class StreamRead:
    """A streaming read of `size` bytes, one thread per core: the memory-bound limit of a step that
    reads that many bytes once."""

    def __init__(self, size: int):
        import numpy as np

        self.parts = np.array_split(np.ones(size // 4, dtype=np.float32), os.cpu_count() or 1)

    def best_ms(self, passes: int = 3) -> float:
        """The fastest of a few reads: a limit is what the machine can do, not what it did once."""
        from concurrent.futures import ThreadPoolExecutor

        import numpy as np

        best = float("inf")
        with ThreadPoolExecutor(len(self.parts)) as pool:
            for _ in range(passes):
                started = time.perf_counter()
                list(pool.map(np.sum, self.parts))
                best = min(best, time.perf_counter() - started)
        return best * 1e3


def run_worker(blas: str, widths: list[int], max_k: int, repeats: int, breakdown: bool, limit: bool) -> dict:
    command = [sys.executable, "-m", "runtime.cli", "bench", "verify", "--worker", "--blas", blas,
               "--widths", ",".join(map(str, widths)), "--max-k", str(max_k), "--repeats", str(repeats)]
    command += ["--limit"] if limit else []
    done = subprocess.run(command + (["--breakdown"] if breakdown else []), capture_output=True, text=True,
                          timeout=1800, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(widths: list[int], max_k: int, repeats: int, breakdown: bool) -> int:
    import kernels

    chosen_name = kernels.BLAS.split(" ", 1)[0]
    same = chosen_name == "openblas"  # then one worker serves both columns, the breakdown included
    # Only the served path's worker reads the limit: a buffer the size of the weights beside the model.
    stock = run_worker("openblas", widths, max_k, repeats, breakdown and same, limit=same)
    chosen = stock if same else run_worker(chosen_name, widths, max_k, repeats, breakdown, limit=True)
    cells = {"openblas stock": stock["ms"]["stock"], "chosen stock": chosen["ms"]["stock"],
             "chosen + rows kernel": chosen["ms"].get("kernel", chosen["ms"]["stock"]),
             "+ compiled layers": chosen["ms"]["compiled"]}
    ratios = {"openblas stock": stock["vs_plain"]["stock"], "chosen stock": chosen["vs_plain"]["stock"],
              "chosen + rows kernel": chosen["vs_plain"].get("kernel", chosen["vs_plain"]["stock"]),
              "+ compiled layers": chosen["vs_plain"]["compiled"]}
    limit_ms = chosen["limit_ms"]
    gb_s = chosen["model_bytes"] / limit_ms / 1e6
    print(f"machine: {os.cpu_count()} cpus; stock: {stock['blas']}; chosen: {chosen['blas']}; "
          f"rows kernel: {chosen['kernel']}")
    print(f"bandwidth {gb_s:.1f} GB/s, {chosen['model_bytes'] / 1e6:.0f} MB per step -> limit {limit_ms:.1f} ms "
          f"(median of the repeats' reads; plain_vs_limit pairs each with its repeat's plain step)\n")
    for width in widths:
        rows = []
        for k in range(max_k + 1):
            row: list = [k]
            for path in PATHS:
                row += [cells[path][f"{width},{k}"], ratios[path][f"{width},{k}"]]
            rows.append(row)
        print(f"width {width}: verify({width},K) ms and / verify({width},0) (median of each repeat's ratio)")
        print(table(["K"] + [h for p in PATHS for h in (p, "ratio")], rows) + "\n")
    for width in widths:
        paired = " ".join(f"K={k} {chosen['paired'][f'{width},{k}']:.3f}" for k in range(max_k + 1))
        print(f"width {width}: + compiled layers / {chosen['paired_against']}, "
              f"median of each repeat's ratio: {paired}")
    for width in widths:
        paired = " ".join(f"K={k} {chosen['fused_vs_mlx'][f'{width},{k}']:.3f}" for k in range(max_k + 1))
        print(f"width {width}: fused kernels / MLX's ops around the products (both compiled layers), "
              f"median of each repeat's ratio: {paired}")
    for width in widths if "half_vs_float32" in chosen else ():
        paired = " ".join(f"K={k} {chosen['half_vs_float32'][f'{width},{k}']:.3f}" for k in range(max_k + 1))
        print(f"width {width}: the kernel reading float16 copies / float32 weights (served path otherwise), "
              f"median of each repeat's ratio: {paired}")
    if chosen.get("kernel_vs_blas"):
        by_rows = " ".join(f"{rows}:{ratio:.2f}" for rows, ratio in sorted(chosen["kernel_vs_blas"].items(),
                                                                            key=lambda item: int(item[0])))
        print(f"rows kernel / {chosen_name} over a step's products, per row count (median of paired calls; "
              f"the kernel takes counts under {chosen['kernel_win_ratio']}): {by_rows}")
    print()
    if "breakdown" in chosen:
        print_breakdown(chosen["breakdown"])
    served, served_ratio = cells["+ compiled layers"], ratios["+ compiled layers"]
    vs_stock = (chosen["compiled_vs_stock"]["1,0"] if same
                else served["1,0"] / cells["openblas stock"]["1,0"])  # two processes: nothing to pair
    print(f"verify1_ratio={served_ratio['1,1']:.3f} "
          f"verify4_ratio={served_ratio.get('4,1', float('nan')):.3f} "
          f"plain_vs_limit={chosen['plain_vs_limit']:.3f} plain_vs_stock={vs_stock:.3f}")
    return 0


def print_breakdown(breakdown: dict) -> None:
    for path, by_rows in breakdown.items():
        rows_seen = sorted(by_rows, key=int)
        groups = list(by_rows[rows_seen[0]])
        lines = []
        for group in groups:
            lines.append([group] + [by_rows[r][group] for r in rows_seen])
        full = {r: by_rows[r]["full verify step"] for r in rows_seen}
        parts = {r: sum(v for g, v in by_rows[r].items() if g != "full verify step") for r in rows_seen}
        lines.append(["graph, dispatch, cache writes (rest)"] + [full[r] - parts[r] for r in rows_seen])
        print(f"breakdown, {path} path: ms by rows verified (1 = plain step)")
        print(table(["op group"] + [f"{r} rows" for r in rows_seen], lines) + "\n")
