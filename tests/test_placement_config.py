"""Placement settings: config fields, their errors, the serve flags, Ray actor options (no Ray needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnitrio.cli import build_parser, describe, load_config, placement_overrides
from omnitrio.config import validate
from omnitrio.config_loading import from_dict
from omnitrio.errors import ConfigError
from omnitrio.placement.actors import actor_options

STAGES = [{"name": "a", "factory_path": "toys.seed.ch4_fanin_stages.create_upper", "process": "p", "terminal": True}]


def test_processes_ask_ray_for_cpus_gpus_and_custom_resources() -> None:
    config = from_dict({"placement": "ray", "processes": {"p": {"num_gpus": 1, "accel": 0.5}}, "stages": STAGES})
    validate(config)
    assert actor_options(config.processes["p"]) == {
        "num_cpus": 0,
        "num_gpus": 1,
        "max_restarts": 0,
        "resources": {"accel": 0.5},
    }


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"placement": "cluster"}, "placement"),
        ({"processes": {"q": {"num_cpus": 1}}}, r"processes\.q: no stage has process = 'q'"),
        ({"processes": {"p": {"num_cpus": -1}}}, r"processes\.p\.num_cpus: must be a number >= 0"),
        ({"processes": {"p": {"replicas": 0}}}, r"processes\.p\.replicas: must be a whole number >= 1, got 0"),
        ({"processes": {"p": {"replicas": 1.5}}}, r"processes\.p\.replicas: must be a whole number >= 1"),
    ],
)
def test_bad_placement_settings_name_the_field(extra: dict[str, object], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        validate(from_dict({"stages": STAGES, **extra}))


def test_serve_flags_place_the_pipeline_on_ray(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        '[[stages]]\nname = "a"\nfactory_path = "toys.seed.ch4_fanin_stages.create_upper"\n'
        'process = "p"\nterminal = true\n'
    )
    args = build_parser().parse_args(["serve", "--config", str(path), "--ray-address", "127.0.0.1:6379"])
    config = load_config(args.config, [*args.overrides, *placement_overrides(args)])
    assert (config.placement, config.ray_address) == ("ray", "127.0.0.1:6379")
    args = build_parser().parse_args(["serve", "--config", str(path)])
    assert load_config(args.config, placement_overrides(args)).placement == "local"


def test_replicas_are_not_a_resource_ray_is_asked_for() -> None:
    config = from_dict({"processes": {"p": {"replicas": 3, "num_cpus": 1}}, "stages": STAGES})
    validate(config)
    assert actor_options(config.resources("p")) == {"num_cpus": 1, "num_gpus": 0, "max_restarts": 0}


def test_a_group_named_like_another_group_s_replica_is_refused() -> None:
    stages = [{**STAGES[0], "next": "b", "terminal": False}, {**STAGES[0], "name": "b", "process": "p.1"}]
    with pytest.raises(ConfigError, match=r"processes\.p\.replicas: its copies are named p\.0, p\.1 …; rename"):
        validate(from_dict({"processes": {"p": {"replicas": 2}}, "stages": stages}))


def test_check_shows_how_many_copies_a_group_runs() -> None:
    config = from_dict({"processes": {"p": {"replicas": 3}}, "stages": STAGES})
    assert "[p x3]" in describe(config)
