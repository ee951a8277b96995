"""metrale bench verify end to end on the default model: a child process per BLAS, every path's
(stock, rows kernel, compiled layers) verify cells, the breakdown, and the last line's four ratios."""

import re

import pytest

from runtime.bench import verify


def test_bench_verify_prints_every_path_the_limit_and_the_ratios(model_dir, capsys):
    assert verify.main(["--widths", "1,4", "--max-k", "2", "--repeats", "1", "--breakdown"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    last = re.fullmatch(r"verify1_ratio=(\d+\.\d+) verify4_ratio=(\d+\.\d+) plain_vs_limit=(\d+\.\d+) "
                        r"plain_vs_stock=(\d+\.\d+)", out[-1])
    assert last and all(float(x) > 0 for x in last.groups())
    assert any(line.startswith("machine:") and "stock: openblas" in line for line in out)
    assert any(re.match(r"bandwidth \d+\.\d GB/s, \d+ MB per step -> limit \d+\.\d ms", line) for line in out)
    for width in (1, 4):
        at = out.index(f"width {width}: verify({width},K) ms and / verify({width},0) (median of each repeat's ratio)")
        assert [line.split()[0] for line in out[at + 2:at + 5]] == ["0", "1", "2"]
        assert "+ compiled layers" in out[at + 1]  # the served path's column
        assert all(len(line.split()) == 9 for line in out[at + 2:at + 5])
    for width in (1, 4):  # the compiled layers against the path under them, paired per repeat
        assert any(re.match(rf"width {width}: \+ compiled layers / .*: K=0 \d+\.\d+ K=1 \d+\.\d+ K=2 \d+\.\d+$", line)
                   for line in out)
    from kernels import rows_matmul

    if rows_matmul.available():  # the kernel's time over the BLAS's at every row count it could take
        found = [line for line in out if line.startswith("rows kernel / ")]
        assert found and [int(cell.split(":")[0]) for cell in found[0].split("): ")[1].split()] == \
            list(range(1, rows_matmul.load().MAX_ROWS + 1))
    assert any(line.startswith("breakdown,") for line in out)
    assert any(line.strip().startswith("lm head") for line in out)


def test_step_bytes_count_the_weights_and_the_cached_context(model_dir):
    from kernels import rows_matmul, step_profile
    from kernels.loader import load

    model = load(model_dir, rows_kernel=False).model
    small, large = step_profile.step_bytes(model, 0), step_profile.step_bytes(model, 1000)
    assert 500e6 < small < 600e6  # the default model's float32 weights, the tied head once
    assert large - small == pytest.approx(2 * 30 * 3 * 64 * 1000 * 4)
    if rows_matmul.load() is not None and rows_matmul.load().HALF_WEIGHTS:
        kernel_model = load(model_dir).model  # its products read float16 copies: half the weights' bytes
        assert step_profile.step_bytes(kernel_model, 0) == pytest.approx(small / 2, rel=0.01)
