"""Finding and loading the drafter a model is served with: its MTP head or a draft model."""

from __future__ import annotations

from pathlib import Path

import kernels  # noqa: F401  (BLAS before mlx)

from kernels.mtp_head import HEAD_CONFIG, HEAD_WEIGHTS

SHIPPED = Path(__file__).resolve().parent / "heads"


def find_mtp_head(model_dir: Path, explicit: str | None = None) -> Path | None:
    """An explicit folder, else one beside the model, else a head shipped for this model's name."""
    if explicit:
        path = Path(explicit).expanduser()
        if not (path / HEAD_WEIGHTS).exists():
            raise FileNotFoundError(f"--mtp-head {path}: no {HEAD_WEIGHTS} there")
        return path
    if (model_dir / HEAD_WEIGHTS).exists() and (model_dir / HEAD_CONFIG).exists():
        return model_dir
    name = model_dir.name.lower()
    for folder in sorted(SHIPPED.glob("*")) if SHIPPED.exists() else ():
        if name.startswith(folder.name.lower()) and (folder / HEAD_WEIGHTS).exists():
            return folder
    return None


def build_drafter(kind: str, target, model_dir: Path, draft_model: str | None, mtp_head: str | None):
    """(resolved kind, engine-side drafter or None). n-gram and none need nothing on the owner."""
    if kind == "auto":
        kind = "mtp" if find_mtp_head(model_dir, mtp_head) is not None else "ngram"
    if kind == "mtp":
        from kernels.drafters import MtpDrafter
        from kernels.mtp_head import load_mtp_head

        path = find_mtp_head(model_dir, mtp_head)
        if path is None:
            raise FileNotFoundError(f"--drafter mtp: no MTP head for {model_dir} (give --mtp-head PATH)")
        return kind, MtpDrafter(load_mtp_head(path), target)
    if kind == "draft-model":
        from kernels.drafters import DraftModelDrafter
        from kernels.loader import load

        return kind, DraftModelDrafter(load(draft_model).model)
    return kind, None
