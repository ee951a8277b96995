"""Every preset in configs/ starts a server that answers (a tiny model, a private cache folder), and
every scheduler mode a flag, preset or the README names is one that runs."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from runtime.bench._inprocess import Served, private_cache
from runtime.config import CONFIG_DIR, SchedulerMode, load_config
from runtime.messages import SamplingParams
from runtime.modes import make_mode
from tests.tiny import save_tiny_dir

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_dir(tmp_path_factory.mktemp("model") / "tiny", seed=5)


@pytest.mark.parametrize("name", PRESETS)
async def test_every_preset_starts_and_answers(name, model_dir):
    with private_cache(load_config(CONFIG_DIR / f"{name}.toml")) as config:
        async with Served(config, model_dir) as client:
            result = await client.generate([5, 6, 7, 5, 6], SamplingParams(max_tokens=6))
            state = client.system.scheduler.describe()
    assert len(result.tokens) == 6 and state["mode"] == config.scheduler.mode


def test_every_named_mode_runs():
    modes = set(typing.get_args(SchedulerMode))
    for mode in modes:
        config = load_config()
        assert make_mode(type(config.scheduler)(mode=mode)).name == mode
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"--scheduler-mode (\w+)", readme))
    presets = {load_config(CONFIG_DIR / f"{p}.toml").scheduler.mode for p in PRESETS}
    assert named <= modes and presets <= modes and {"serial", "mtp_batch", "hyper"} <= presets
