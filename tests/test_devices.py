"""Placing model stages: ``schedulers.devices`` (one helper every family uses) and ``--device``/``--dtype``.

No weights are read here: the helper's checks and builds, and what the flags set in a loaded config.
``tests/test_qwen3_omni_bfloat16.py`` serves a checkpoint placed this way.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from transformers import PretrainedConfig, PreTrainedModel

from omnitrio.cli import main
from omnitrio.config_loading import load
from omnitrio.errors import ConfigError
from schedulers.devices import Placement, PlacementError, build, check_placement, to_host

ROOT = Path(__file__).resolve().parent.parent
QWEN3_OMNI = ROOT / "configs" / "qwen3-omni.toml"
MODEL_STAGES = {"preprocess", "audio_encoder", "image_encoder", "thinker", "talker", "code2wav"}


@pytest.mark.parametrize(
    ("device", "dtype", "error"),
    [
        ("gpu", "float32", "thinker: device='gpu' is not a device; use 'cpu', 'cuda' or 'cuda:N'"),
        ("meta", "float32", "thinker: device='meta': only 'cpu', 'cuda' and 'cuda:N' are supported"),
        ("cpu", "fp8", "thinker: dtype='fp8' is not one of float32, bfloat16, float16"),
        ("cpu", "int8", "thinker: dtype='int8' is not one of"),
    ],
)
def test_a_device_or_dtype_a_stage_cannot_use_is_refused_naming_stage_and_field(
    device: str, dtype: str, error: str
) -> None:
    with pytest.raises(PlacementError) as raised:
        Placement.of("thinker", device, dtype)
    assert str(raised.value).startswith(error)


def test_cuda_must_be_a_device_this_torch_sees() -> None:
    beyond = f"cuda:{torch.cuda.device_count()}"  # one past the last (cuda:0 on a machine without CUDA)
    with pytest.raises(PlacementError, match=f"code2wav: device='{beyond}': "):
        Placement.of("code2wav", beyond)


def test_with_one_gpu_cuda_and_cuda_0_are_taken_and_cuda_1_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert Placement.of("thinker", "cuda", "bfloat16").device == torch.device("cuda")
    assert Placement.of("thinker", "cuda:0").device == torch.device("cuda:0")
    with pytest.raises(PlacementError, match=r"thinker: device='cuda:1': this machine's CUDA devices are cuda:0$"):
        Placement.of("thinker", "cuda:1")


def test_a_cpu_placement_never_asks_cuda_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("CUDA was consulted for a CPU stage")

    for name in ("is_available", "device_count", "init", "_lazy_init", "current_device"):
        monkeypatch.setattr(torch.cuda, name, refuse)
    assert Placement.of("talker", "cpu", "bfloat16") == Placement(torch.device("cpu"), torch.bfloat16)
    check_placement(device="cpu", dtype="float16", model_dir="ignored")


def test_what_a_stage_hands_on_is_a_float32_cpu_copy() -> None:
    computed = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    handed = to_host(computed[:, 1:])
    assert handed.dtype == torch.float32 and handed.device.type == "cpu"
    assert handed.tolist() == [[1.0, 2.0], [4.0, 5.0]]
    assert handed.untyped_storage().data_ptr() != computed.untyped_storage().data_ptr()
    assert to_host(torch.tensor([3, 4])).dtype == torch.int64


class _ProbeConfig(PretrainedConfig):
    model_type = "devices-probe"


class _Probe(PreTrainedModel):
    """A model that notes torch's default dtype while it is being built, with a computed buffer."""

    config_class = _ProbeConfig
    seen: ClassVar[list[Any]] = []

    def __init__(self, config: _ProbeConfig) -> None:
        super().__init__(config)
        _Probe.seen.append(torch.get_default_dtype())
        self.linear = torch.nn.Linear(4, 4)
        self.scale = torch.nn.Buffer(torch.ones(4))  # saved with the weights
        self.frequencies = torch.nn.Buffer(torch.arange(4, dtype=torch.float32), persistent=False)  # computed


def test_building_in_bfloat16_leaves_torchs_default_dtype_alone_for_the_other_threads() -> None:
    """transformers' own _from_config(dtype=...) sets the process-wide default while it builds: a
    stage building beside it in another thread would make half of its module in bfloat16."""
    _Probe.seen.clear()
    module = build(_Probe, _ProbeConfig(), torch.bfloat16)
    assert _Probe.seen == [torch.float32]
    assert module.linear.weight.dtype == module.linear.bias.dtype == module.scale.dtype == torch.bfloat16
    assert module.frequencies.dtype == torch.float32  # as from_pretrained(dtype=bfloat16) keeps it
    seen_elsewhere: list[Any] = []
    thread = threading.Thread(target=lambda: seen_elsewhere.append(torch.get_default_dtype()))
    thread.start()
    thread.join()
    assert seen_elsewhere == [torch.float32]


class _Slow(_Probe):
    """Waits, while it is being built, to see whether a build in another thread finishes meanwhile."""

    second_done = threading.Event()
    overlapped: ClassVar[list[bool]] = []
    inside = threading.Event()

    def __init__(self, config: _ProbeConfig) -> None:
        super().__init__(config)
        _Slow.inside.set()
        _Slow.overlapped.append(_Slow.second_done.wait(timeout=0.5))


def test_builds_in_two_threads_take_turns_and_leave_torchs_init_functions_alone() -> None:
    """transformers' no_init_weights swaps torch's init functions process-wide: two overlapping builds
    would leave them no-ops for every model made later in the process."""
    normal = torch.nn.init.normal_

    def second() -> None:
        _Slow.inside.wait()
        build(_Probe, _ProbeConfig(), torch.float32)
        _Slow.second_done.set()

    thread = threading.Thread(target=second)
    thread.start()
    build(_Slow, _ProbeConfig(), torch.bfloat16)
    thread.join()
    assert _Slow.overlapped == [False]  # the second build waited for the first
    assert torch.nn.init.normal_ is normal


# -- the flags ------------------------------------------------------------------------------------------


def test_the_flags_place_every_model_stage_of_qwen3_omni(tmp_path: Path) -> None:
    config = load(QWEN3_OMNI, model=tmp_path, device="cuda:1", dtype="bfloat16")
    devices = {stage.name: stage.factory.values.get("device") for stage in config.stages}
    dtypes = {stage.name: stage.factory.values.get("dtype") for stage in config.stages}
    assert {name for name, value in devices.items() if value is not None} == MODEL_STAGES
    assert set(devices.values()) == {"cuda:1", None}
    # preprocess has no weights: it computes the log-mel where it is put and hands on float32
    assert {name for name, value in dtypes.items() if value is not None} == MODEL_STAGES - {"preprocess"}
    assert set(dtypes.values()) == {"bfloat16", None}


def test_a_stages_own_set_wins_over_the_flags(tmp_path: Path) -> None:
    overrides = ['talker.factory.device="cpu"', 'code2wav.factory.dtype="float32"']
    config = load(QWEN3_OMNI, overrides, model=tmp_path, device="cuda", dtype="bfloat16")
    assert config.stage("talker").factory.values["device"] == "cpu"
    assert config.stage("talker").factory.values["dtype"] == "bfloat16"
    assert config.stage("code2wav").factory.values["dtype"] == "float32"
    assert config.stage("thinker").factory.values["device"] == "cuda"


def placed_factory(*, device: str = "cpu") -> Any:
    """A factory that takes a device but no dtype (validation only imports it)."""


def plain_factory() -> Any:
    """A factory that takes neither."""


def _pipeline(tmp_path: Path, *factories: str) -> Path:
    stages = [
        f'[[stages]]\nname = "s{i}"\nfactory_path = "tests.test_devices.{factory}"\n'
        + (f'next = "s{i + 1}"\n' if i + 1 < len(factories) else "terminal = true\n")
        for i, factory in enumerate(factories)
    ]
    path = tmp_path / "pipeline.toml"
    path.write_text("\n".join(stages))
    return path


def test_a_flag_sets_only_the_stages_whose_factory_takes_it(tmp_path: Path) -> None:
    config = load(_pipeline(tmp_path, "plain_factory", "placed_factory"), device="cpu")
    assert config.stage("s0").factory.values == {}
    assert config.stage("s1").factory.values == {"device": "cpu"}


def test_a_flag_no_stage_takes_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--dtype: no stage of this pipeline takes a 'dtype' factory argument"):
        load(_pipeline(tmp_path, "plain_factory", "placed_factory"), dtype="bfloat16")


def test_check_asks_every_model_stage_whether_it_can_run_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--model", str(tmp_path), "--device", "gpu", str(QWEN3_OMNI)]) == 2
    err = capsys.readouterr().err
    for stage in MODEL_STAGES:
        assert f"stage {stage!r}: device='gpu' is not a device" in err
    with pytest.raises(SystemExit):
        main(["check", "--dtype", "fp8", str(QWEN3_OMNI)])
