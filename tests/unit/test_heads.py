"""Models users bring: a quantized, renamed copy of a base reports its quantization and still gets
the base's MTP head; a head is refused, with its reason, for a model it does not fit."""

import json
import logging
import shutil

import mlx.core as mx
import pytest
import structlog
from structlog.testing import capture_logs

from kernels.heads import base_record, find_mtp_head, misfit
from kernels.loader import load
from kernels.mtp_head import MTPConfig, MTPHead, save_mtp_head
from tests.tiny import save_tiny_dir


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_dir(tmp_path_factory.mktemp("models") / "tiny-base")


def quantized_copy(base, folder, bits=4, group_size=64):
    """What `mlx_lm convert -q` makes of the base, saved under another name."""
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    model, config = load_model(base)
    model, config = quantize_model(model, config, group_size, bits)
    folder.mkdir(parents=True)
    save_model(folder, model)
    save_config(config, folder / "config.json")
    tokenizer = json.loads((base / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, indent=1))  # re-saved, other bytes
    return folder


def head_for(model_dir, folder):
    mx.random.seed(0)
    head = MTPHead(MTPConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128))
    return save_mtp_head(head, folder, base=base_record(model_dir))


@pytest.fixture
def shipped(base, tmp_path, monkeypatch):
    """A head trained for the tiny base, shipped (the only one) under a name unlike any model's."""
    heads = tmp_path / "heads"
    head_for(base, heads / "some-head")
    monkeypatch.setattr("kernels.heads.SHIPPED", heads)
    return heads / "some-head"


def test_the_loader_reports_bits_group_and_activations(base, tmp_path):
    assert load(base).dtype == "float32" and load(base).quantization is None
    q = load(quantized_copy(base, tmp_path / "my-model-4bit"))
    assert q.dtype == "4-bit (group 64), float32 activations"
    assert q.quantization == {"bits": 4, "group_size": 64, "mode": "affine"}
    assert load(quantized_copy(base, tmp_path / "eight", bits=8, group_size=32)).dtype.startswith("8-bit (group 32)")


def test_a_renamed_quantized_copy_gets_the_bases_head(base, shipped, tmp_path):
    copy = quantized_copy(base, tmp_path / "renamed-q4")
    assert find_mtp_head(base) == shipped
    assert find_mtp_head(copy) == shipped


@pytest.fixture
def logs():
    """Info events, also after an earlier test in this process quieted structlog (bench, calibrate)."""
    quiet = structlog.get_config()["wrapper_class"]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    with capture_logs() as captured:
        yield captured
    structlog.configure(wrapper_class=quiet)


@pytest.mark.parametrize("other,reason", [
    (dict(hidden_size=32, intermediate_size=64), "hidden_size is 32; the head is for 64"),
    (dict(num_hidden_layers=3), "num_hidden_layers is 3; the head is for 2"),
    (dict(vocab_size=96), "vocab_size is 96; the head is for 128"),
    (dict(vocab_order=-1), "vocabulary (tokenizer.json) differs"),
])
def test_a_head_is_refused_for_a_model_it_does_not_fit_and_says_why(shipped, tmp_path, logs, other, reason):
    model = save_tiny_dir(tmp_path / "tiny-base-copy", **other)
    assert find_mtp_head(model) is None
    [refused] = [e for e in logs if e["event"] == "mtp_head_refused"]
    assert reason in refused["reason"] and refused["head"] == str(shipped)
    with pytest.raises(ValueError, match="does not fit"):
        find_mtp_head(model, explicit=str(shipped))  # asked for by path: an error, not a silent fallback


def test_a_shipped_head_must_record_its_base_but_one_beside_the_model_need_not(base, tmp_path, monkeypatch):
    heads = tmp_path / "heads"
    save_mtp_head(MTPHead(MTPConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                    intermediate_size=128)), heads / "old")
    monkeypatch.setattr("kernels.heads.SHIPPED", heads)
    assert misfit(heads / "old", base) == "the head records no base model"
    assert find_mtp_head(base) is None
    beside = tmp_path / "with-head"
    shutil.copytree(base, beside)
    shutil.copy(heads / "old" / "mtp_head.json", beside)
    shutil.copy(heads / "old" / "mtp_head.safetensors", beside)
    assert find_mtp_head(beside) == beside  # the shape still fits: hidden size 64


def test_the_found_head_drafts_for_the_quantized_copy_without_changing_its_output(base, shipped, tmp_path):
    from kernels.engine import Engine
    from kernels.heads import build_drafter

    copy = quantized_copy(base, tmp_path / "renamed-q4")
    model = load(copy).model
    kind, drafter = build_drafter("auto", model, copy, None, None)
    assert kind == "mtp"
    prompt, n = [5, 9, 5, 9, 5, 3, 7], 16
    plain = Engine(model)
    want = [plain.prefill("s", prompt, 0.0, 1.0, None, False)]
    while len(want) < n:
        want += plain.decode(["s"], [False])
    spec = Engine(model, drafter=drafter)
    got = [spec.prefill("s", prompt, 0.0, 1.0, None, False)]
    while len(got) < n:
        drafts = spec.propose("s", 3)[0]
        accepted, emitted = spec.verify("s", drafts, True)
        spec.rollback("s", len(drafts), accepted, emitted)
        got += emitted
    assert got[:n] == want
