"""Only kernels/ and the model owner import mlx: every MLX call stays on the owner's thread."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {ROOT / "actors" / "model_owner.py"}


def imports_mlx(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "mlx" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mlx":
            return True
    return False


def test_no_mlx_import_outside_kernels_and_the_model_owner():
    offenders = [str(p.relative_to(ROOT)) for folder in ("runtime", "actors")
                 for p in (ROOT / folder).rglob("*.py") if p not in ALLOWED and imports_mlx(p)]
    assert offenders == []


def test_the_check_catches_an_mlx_import(tmp_path):
    sample = tmp_path / "sneaky.py"
    sample.write_text("def f():\n    import mlx.core as mx\n")
    assert imports_mlx(sample)


def test_kernels_is_the_projects_wherever_metrale_runs(tmp_path):
    # The console script runs with .venv/bin, not the repository, first on sys.path: a distribution
    # with its own top-level `kernels` (transformers 5.25 pulls one in) would win there.
    import subprocess
    import sys

    found = subprocess.run([sys.executable, "-c", "import runtime.cli, kernels; print(kernels.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).resolve() == ROOT / "kernels" / "__init__.py"


def test_metrale_stops_with_the_fix_when_another_kernels_shadows_it(tmp_path):
    import subprocess
    import sys

    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    ran = subprocess.run([sys.executable, "-c", "import runtime.cli; runtime.cli.main(['serve'])"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.returncode != 0 and "pip uninstall kernels" in ran.stderr
