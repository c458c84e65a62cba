"""Every validation rule of SPEC §2 gives one error naming the stage and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from omnitrio.config import FactoryArgs, PipelineConfig, StageConfig, validate
from omnitrio.config_loading import apply_override, from_dict, load
from omnitrio.errors import ConfigError

T = "toys.stages"


def stage(name: str, **kw: Any) -> StageConfig:
    kw.setdefault("factory_path", f"{T}.create_echo")
    return StageConfig(name=name, **kw)


def chain(*stages: StageConfig) -> PipelineConfig:
    return PipelineConfig(stages=list(stages))


CASES = {
    "duplicate_name": (
        chain(stage("a", next="b"), stage("b", terminal=True), stage("b", terminal=True)),
        r"stages\[2\] \('b'\): name: duplicate of stages\[1\]",
    ),
    "both_next_and_terminal": (chain(stage("a", next="b", terminal=True), stage("b", terminal=True)), r"\('a'\): next"),
    "neither_next_nor_terminal": (
        chain(stage("a", next=["b", "c"]), stage("b"), stage("c", terminal=True)),
        r"\('b'\): next: .*sets neither",
    ),
    "unknown_next": (chain(stage("a", next="zz"), stage("b", terminal=True)), r"\('a'\): next: unknown stage 'zz'"),
    "route_fn_on_terminal": (
        chain(stage("a", terminal=True, route_fn=f"{T}.route_to_nowhere")),
        r"\('a'\): route_fn: a terminal stage",
    ),
    "wait_for_without_merge_fn": (
        chain(stage("a", next="b"), stage("b", terminal=True, wait_for=["a"])),
        r"stages\[1\] \('b'\): wait_for: wait_for needs merge_fn",
    ),
    "wait_for_unknown_stage": (
        chain(stage("a", next="b"), stage("b", terminal=True, wait_for=["ghost"], merge_fn=f"{T}.merge_by_name")),
        r"\('b'\): wait_for: unknown stage 'ghost'",
    ),
    "wait_for_source_that_never_sends": (
        chain(
            stage("a", next=["b", "c"]),
            stage("b", terminal=True),
            stage("c", terminal=True, wait_for=["b"], merge_fn=f"{T}.merge_by_name"),
        ),
        r"\('c'\): wait_for: 'b' never sends here",
    ),
    "wait_for_fn_without_wait_for": (
        chain(stage("a", terminal=True, wait_for_fn=f"{T}.wait_by_length")),
        r"\('a'\): wait_for_fn: wait_for_fn needs wait_for",
    ),
    "unknown_stream_to": (
        chain(stage("a", next="b", stream_to=["zz"]), stage("b", terminal=True)),
        r"\('a'\): stream_to: unknown stage 'zz'",
    ),
    "stream_done_to_fn_without_stream_to": (
        chain(stage("a", next="b", stream_done_to_fn=f"{T}.route_to_nowhere"), stage("b", terminal=True)),
        r"\('a'\): stream_done_to_fn: .*needs stream_to",
    ),
    "unreachable_stage": (
        chain(stage("a", terminal=True), stage("island", terminal=True)),
        r"stages\[1\] \('island'\): unreachable",
    ),
    "cycle_in_next": (
        chain(stage("a", next="b"), stage("b", next="c"), stage("c", next=["b", "d"]), stage("d", terminal=True)),
        r"next: cycle",
    ),
    "unimportable_factory_module": (
        chain(stage("a", terminal=True, factory_path="no_such_module.create")),
        r"\('a'\): factory_path: cannot import module 'no_such_module'",
    ),
    "factory_attribute_missing": (
        chain(stage("a", terminal=True, factory_path=f"{T}.no_such_factory")),
        r"\('a'\): factory_path: module 'toys.stages' has no attribute 'no_such_factory'",
    ),
    "factory_argument_not_accepted": (
        chain(stage("a", terminal=True, factory=FactoryArgs(max_batch_wait_ms=5))),
        r"\('a'\): factory: toys.stages.create_echo does not accept \['max_batch_wait_ms'\]",
    ),
    "factory_argument_missing": (
        chain(stage("a", terminal=True, factory_path=f"{T}.create_needs_arg")),
        r"\('a'\): factory: .*missing a required argument: 'size'",
    ),
    "unimportable_route_fn": (
        chain(stage("a", next="b", route_fn=f"{T}.nope"), stage("b", terminal=True)),
        r"\('a'\): route_fn: module 'toys.stages' has no attribute 'nope'",
    ),
    "projection_for_a_stage_not_in_next": (
        chain(stage("a", next="b", project_payload={"c": f"{T}.project_text"}), stage("b", terminal=True)),
        r"\('a'\): project_payload: 'c' is not in next",
    ),
    "unknown_entry_stage": (
        PipelineConfig(stages=[stage("a", terminal=True)], entry_stage="zz"),
        r"entry_stage: unknown stage 'zz'",
    ),
    "no_terminal_stage": (chain(stage("a", next="b"), stage("b", next="a")), r"no stage is terminal"),
    "scheduler_nice_above_19": (
        PipelineConfig(stages=[stage("a", terminal=True)], scheduler_nice=20),
        r"scheduler_nice: must be an integer from 0 to 19, got 20",
    ),
    "scheduler_nice_negative": (
        PipelineConfig(stages=[stage("a", terminal=True)], scheduler_nice=-1),
        r"scheduler_nice: must be an integer from 0 to 19, got -1",
    ),
    "two_senders_without_wait_for": (
        chain(stage("a", next=["b", "c"]), stage("b", next="d"), stage("c", next="d"), stage("d", terminal=True)),
        r"\('d'\): wait_for: several stages send here",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_invalid_config_names_stage_and_field(case: str) -> None:
    config, pattern = CASES[case]
    with pytest.raises(ConfigError, match=pattern):
        validate(config)


def test_stream_edges_may_loop_back() -> None:
    validate(chain(stage("a", next="b"), stage("b", terminal=True, stream_to=["a"])))


def test_model_path_names_the_pipeline_and_entry_defaults_to_first_stage() -> None:
    config = PipelineConfig(model_path="toy", stages=[stage("a", terminal=True)])
    assert config.name == "toy"
    assert config.entry_stage == "a"


def test_factory_path_accepts_colon_spelling() -> None:
    validate(chain(stage("a", terminal=True, factory_path=f"{T}:create_echo")))


TOML = """
name = "demo"
[[stages]]
name = "encoder"
factory_path = "toys.stages.create_slow"
terminal = true
[stages.factory]
seconds = 0.5
"""


def test_toml_file_loads_and_overrides_apply(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(TOML)
    config = load(path, ["encoder.factory.seconds=0.01", "max_in_flight=7"])
    assert config.name == "demo"
    assert config.stage("encoder").factory.to_kwargs() == {"seconds": 0.01}
    assert config.max_in_flight == 7


@pytest.mark.parametrize(("flag", "name"), [("name_from_model = true\n", "my-checkpoint"), ("", "demo")])
def test_model_names_the_pipeline_only_where_the_config_asks(tmp_path: Path, flag: str, name: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(flag + 'model_args = ["encoder.factory.seconds"]\n' + TOML)
    config = load(path, ["encoder.factory.seconds=0.01"], model=tmp_path / "my-checkpoint")
    assert config.name == name


def test_toml_unknown_field_names_the_stage(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(TOML.replace("terminal = true", "terminal = true\nnexxt = 'x'"))
    with pytest.raises(ConfigError, match=r"stages\[0\] \('encoder'\): unknown field\(s\) \['nexxt'\]"):
        load(path)


def test_toml_wrong_type_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"stages\[0\] \('a'\): .*terminal"):
        from_dict({"stages": [{"name": "a", "factory_path": f"{T}.create_echo", "terminal": "perhaps"}]})


def test_override_of_unknown_stage_is_an_error() -> None:
    with pytest.raises(ConfigError, match="'ghost' is neither a stage nor a pipeline field"):
        apply_override({"stages": [{"name": "a"}]}, "ghost.factory.x=1")


def test_override_value_without_equals_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"must look like key\.path=value"):
        apply_override({"stages": []}, "max_in_flight")


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "missing.toml")
