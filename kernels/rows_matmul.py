"""The few-rows matrix product (kernels/rows_matmul/rows_matmul.cpp): built once per machine, swapped
into a model's linear layers, stock MLX ops wherever it cannot run.

Decode and verify steps multiply 1-16 rows by every weight matrix. The kernel reads each weight row
once for all of them and computes every output as the same dot product whatever the row count, so
a verify row's logits are bit for bit a plain step's. It is built with CMake against the installed
MLX and nanobind, for this machine's vector units, into the environment's build folder; a build or
load failure leaves the stock matmul in place with a warning, never a crash.

Where every value of a weight matrix is exactly a float16 (the default model's are: its file is
float16, loaded as float32 for MLX's CPU ops), the kernel reads a float16 copy and widens each value
in a register: a decode step reads half the bytes for the same float32 sums, bit for bit. The
float32 weights stay for the stock paths (prefill, wide batches), which MLX runs fastest in float32.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import shutil
import subprocess
import sys
import warnings
import weakref
from pathlib import Path

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import AllToShardedLinear, ShardedToAllLinear

SOURCE = Path(__file__).with_name("rows_matmul")
BUILD_ROOT = Path(sys.prefix) / "metrale-build"
_module = None
_failure: str | None = None
_rows: frozenset[int] = frozenset()  # row counts the kernel takes: chosen at the first install
_rows_chosen = False
# Bumped whenever a product's path may have changed (layers swapped, row counts chosen): graphs traced
# before (kernels/compiled_blocks.py) trace again.
swaps = 0
_half_weights = True  # the kernel reads float16 copies where exact (benchmarks time both)


def available() -> bool:
    return load() is not None


def status() -> str:
    """What /health and benchmarks report: the row counts it takes, or why it is off."""
    if not available():
        return f"off ({_failure})"
    if not _rows_chosen:
        return "built (its row counts are timed at the first model load)"
    return f"on for {_spans(_rows)} rows" if _rows else "built; won at no row count here"


def _spans(rows: frozenset[int]) -> str:
    ordered, spans = sorted(rows), []
    for r in ordered:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def load():
    """The extension module, built first if this machine has none; None when it cannot be had."""
    global _module, _failure
    if _module is not None or _failure is not None:
        return _module
    try:
        built = build(SOURCE, BUILD_ROOT)
        spec = importlib.util.spec_from_file_location("_rows_matmul", built)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _check(module)
        _module = module
    except Exception as e:  # noqa: BLE001  (any failure means stock ops, said once)
        _failure = f"{type(e).__name__}: {' '.join(str(e).split())}"[:400]
        warnings.warn(f"rows_matmul kernel unavailable, using stock MLX matmul: {_failure}", stacklevel=2)
    return _module


def build(source: Path, root: Path) -> Path:
    """The built library for these sources, this MLX and this machine (built now if missing)."""
    out = root / f"rows_matmul-{build_key(source)}"
    found = sorted(out.glob("_rows_matmul*.so"))
    if found:
        return found[0]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # servers starting together build once
        found = sorted(out.glob("_rows_matmul*.so"))
        if not found:
            _cmake(source, out)
            found = sorted(out.glob("_rows_matmul*.so"))
        if not found:
            raise RuntimeError(f"the build in {out} made no library")
    return found[0]


def build_key(source: Path) -> str:
    from runtime.blas import machine_key

    import nanobind

    digest = hashlib.sha256()
    for path in sorted(source.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(f"{mx.__version__} {nanobind.__version__} {machine_key({})}".encode())
    return digest.hexdigest()[:16]


def _cmake(source: Path, out: Path) -> None:
    import nanobind

    cmake = shutil.which("cmake", path=str(Path(sys.executable).parent)) or shutil.which("cmake") or "cmake"
    mlx_cmake = Path(mx.__file__).parent / "share" / "cmake" / "MLX"  # mlx/core*.so -> mlx/share
    work = out / "work"
    configure = [cmake, "-S", str(source), "-B", str(work), f"-DPython_EXECUTABLE={sys.executable}",
                 f"-DMLX_DIR={mlx_cmake}", f"-Dnanobind_DIR={nanobind.cmake_dir()}",
                 f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out}"]
    for command in (configure, [cmake, "--build", str(work), "-j"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(command[0]).name} {command[1]} failed: {(done.stderr or done.stdout)[-2000:]}")


def _check(module) -> None:
    """The built kernel must agree with MLX's matmul before any model uses it."""
    x, w = mx.random.normal((3, 40)), mx.random.normal((37, 40))
    if not mx.allclose(module.rows_matmul(x, w), x @ w.T, rtol=1e-4, atol=1e-4).item():
        raise RuntimeError("the built kernel disagrees with mx.matmul")


def product(x: mx.array, w: mx.array, residual: mx.array | None = None, half=None) -> mx.array:
    """x [..., K] @ w[N, K].T (plus the residual, where given: the same rounding) by the kernel at the row
    counts where it won here, else by MLX. half: `halved(w)`, whose float16 copy the kernel reads."""
    if takes(x, w):
        half_w = half[1] if _half_weights and half is not None and half[0]() is w else None
        return _module.rows_matmul(x, w if half_w is None else half_w, residual)
    return x @ w.T if residual is None else residual + x @ w.T


def halved(w: mx.array) -> tuple | None:
    """(a weak reference to w, w as float16) where the kernel reads float16 weights and every value of w
    is exactly a float16; else None. The reference tells a copy of a weight since replaced."""
    if _module is None or not _module.HALF_WEIGHTS or w.dtype != mx.float32 or w.ndim != 2:
        return None
    half = w.astype(mx.float16)
    if not mx.array_equal(half.astype(mx.float32), w).item():
        return None
    mx.eval(half)
    return weakref.ref(w), half


def stacked_half(w: mx.array, layers) -> tuple | None:
    """halved(w) for w stacked from these RowsLinear layers' weights. Where every layer has a copy that
    still stands for its weight, the stack's is theirs stacked (exact, as each is): no second conversion
    and check at load. Otherwise (a copy dropped, or a weight replaced since) halved(w) itself."""
    pairs = [layer._half for layer in layers]
    if not pairs or any(pair is None or pair[0]() is not layer.weight for pair, layer in zip(pairs, layers)):
        return halved(w)
    half = mx.concatenate([pair[1] for pair in pairs])
    mx.eval(half)
    return weakref.ref(w), half


def use_half_weights(on: bool) -> None:
    """Whether the kernel reads the float16 copies (benchmarks time the float32 weights' path too)."""
    global _half_weights, swaps
    _half_weights, swaps = on, swaps + 1


def half_weights() -> bool:
    return _half_weights and _module is not None and bool(_module.HALF_WEIGHTS)


def reads_halves(model: nn.Module) -> bool:
    """Whether this model's few-row products read float16 copies (its layers are the kernel's)."""
    return half_weights() and any(type(m) in (RowsLinear, RowsShardedToAll, RowsEmbedding) for m in model.modules())


def takes(x: mx.array, w: mx.array) -> bool:
    """Whether product(x, w) runs on the kernel (where each output is its own dot product, so a
    product by stacked weights gives each part's outputs bit for bit)."""
    return _module is not None and x.dtype == mx.float32 and w.dtype == mx.float32 and x.size // x.shape[-1] in _rows


def taken_rows() -> frozenset[int]:
    return _rows


class RowsLinear(nn.Module):
    """A bias-free float32 nn.Linear whose few-row products go through the kernel."""

    def __init__(self, weight: mx.array):
        super().__init__()
        self.weight = weight
        object.__setattr__(self, "_half", halved(weight))  # not a parameter: never saved or updated

    def __call__(self, x: mx.array) -> mx.array:
        return self.product(x)

    def product(self, x: mx.array, residual: mx.array | None = None) -> mx.array:
        return product(x, self.weight, residual, self._half)

    def forget_half(self) -> None:
        """Drop the float16 copy (its weight became a view into a stack that has its own)."""
        object.__setattr__(self, "_half", None)


class RowsShardedToAll(nn.Module):
    """A tensor-parallel row shard (mlx.nn's ShardedToAllLinear, bias-free): the kernel's product of
    this rank's part, then the sum over the group."""

    def __init__(self, weight: mx.array, group):
        super().__init__()
        self.weight, self.group = weight, group
        object.__setattr__(self, "_half", halved(weight))

    def __call__(self, x: mx.array) -> mx.array:
        return mx.distributed.all_sum(product(x, self.weight, half=self._half), group=self.group)


class RowsEmbedding(nn.Embedding):
    """A tied embedding whose use as the LM head goes through the kernel."""

    def __init__(self, weight: mx.array):
        super().__init__(*weight.shape)
        self.weight = weight
        object.__setattr__(self, "_half", halved(weight))

    def as_linear(self, x: mx.array) -> mx.array:
        return product(x, self.weight, half=self._half)


def install(model: nn.Module) -> int:
    """Swap the model's float32 bias-free linear layers (and a tied LM head) for kernel ones;
    returns how many were swapped (0 when the kernel is unavailable)."""
    if load() is None:
        return 0
    choose_for(model)
    return _swap_all(model, _to_kernel)


def choose_for(model: nn.Module) -> frozenset[int]:
    """The row counts the kernel takes: the first model's products decide, once per machine."""
    global _rows, _rows_chosen, swaps
    if not _rows_chosen and load() is not None:
        from kernels.rows_verdict import rows_for

        _rows, _rows_chosen, swaps = rows_for(products(model)), True, swaps + 1
    return _rows


def adopt(rows) -> None:
    """Take another process's row counts instead of timing here: a distributed group's ranks must
    compute their replicated parts (the LM head) alike, so they all take rank 0's."""
    global _rows, _rows_chosen, swaps
    _rows, _rows_chosen, swaps = frozenset(rows), True, swaps + 1


def products(model: nn.Module) -> list[mx.array]:
    """Every float32 weight matrix the model multiplies by (a step multiplies each once)."""
    from mlx.utils import tree_flatten

    return [v for _, v in tree_flatten(model.parameters()) if v.ndim == 2 and v.dtype == mx.float32]


def uninstall(model: nn.Module) -> None:
    """Stock layers back (benchmarks time both paths in one process)."""
    _swap_all(model, _to_stock)


def _to_kernel(layer):
    if type(layer) in (nn.Linear, AllToShardedLinear) and "bias" not in layer and layer.weight.dtype == mx.float32:
        return RowsLinear(layer.weight)  # a column shard's forward is its own product alone
    if type(layer) is ShardedToAllLinear and "bias" not in layer and layer.weight.dtype == mx.float32:
        return RowsShardedToAll(layer.weight, layer.group)
    if type(layer) is nn.Embedding and layer.weight.dtype == mx.float32:
        return RowsEmbedding(layer.weight)
    return None


def _to_stock(layer):
    if type(layer) is RowsShardedToAll:
        out, shard_in = layer.weight.shape
        stock = ShardedToAllLinear(shard_in * layer.group.size(), out, bias=False, group=layer.group)
    elif type(layer) is RowsLinear:
        stock = nn.Linear(*reversed(layer.weight.shape), bias=False)
    elif type(layer) is RowsEmbedding:
        stock = nn.Embedding(*layer.weight.shape)
    else:
        return None
    stock.weight = layer.weight
    return stock


def _swap_all(model: nn.Module, replace) -> int:
    """_swap over the whole model, counted in `swaps` (compiled graphs of its layers trace again)."""
    global swaps
    swaps += 1
    return _swap(model, replace)


def _swap(module: nn.Module, replace) -> int:
    """Replace every layer below `module` that `replace` maps to a new one; how many were."""
    swapped = 0
    for name in list(module.children()):
        child = module[name]  # children() hands out copies of lists; swap in the module's own
        items = child if isinstance(child, list) else [child]
        for i, item in enumerate(items):
            if not isinstance(item, nn.Module):
                continue
            if (new := replace(item)) is None:
                swapped += _swap(item, replace)
                continue
            if isinstance(child, list):
                child[i] = new
            else:
                setattr(module, name, new)
            swapped += 1
    return swapped


if __name__ == "__main__":  # `make setup` builds it at install time, so the first serve does not wait
    print(f"rows_matmul kernel: {status()}")
