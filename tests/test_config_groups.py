"""`Config` groups its fields by concern; flags and config.json stay flat.

A flat name (the flag's) must say its group unambiguously, old flat
config.json files must still load, and a flat field given to `Config(...)`
or `dataclasses.replace` must land in its group.
"""

import dataclasses
import json

import pytest

from layers import aux_heads
from train import config as config_lib
from train import config_fields
from train import run_io


def test_every_field_is_in_exactly_one_group_and_no_group_is_a_field():
  groups = [group for group, _ in config_fields.GROUPS]
  names = [f.name for _, kind in config_fields.GROUPS
           for f in dataclasses.fields(kind)]
  assert len(names) == len(set(names)) == len(config_lib.flat_fields())
  assert not set(groups) & set(names)
  grouped = config_lib.Config  # its own fields are the groups
  assert [f.name for f in dataclasses.fields(grouped)] == groups


def test_a_flat_field_lands_in_its_group():
  config = config_lib.Config(num_modules=2, learning_rate=0.5, seed=7)
  assert (config.interlock.num_modules, config.optim.learning_rate,
          config.run.seed) == (2, 0.5, 7)
  assert config.network == config_lib.ModelConfig()  # untouched groups
  moved = dataclasses.replace(config, placement="simulated", seed=8)
  assert (moved.devices.placement, moved.run.seed,
          moved.interlock.num_modules) == ("simulated", 8, 2)
  assert config.run.seed == 7  # replace made a copy
  with pytest.raises(dataclasses.FrozenInstanceError):
    config.run.seed = 9  # pytype: disable=not-writable


def test_an_unknown_field_or_a_wrong_group_is_refused():
  with pytest.raises(TypeError, match=r"no fields \['num_module'\]"):
    config_lib.Config(num_module=2)
  with pytest.raises(TypeError, match=r"Config.run must be a RunConfig"):
    config_lib.Config(run=config_lib.DataConfig())
  with pytest.raises(AttributeError, match="no field 'interlock'"):
    config_lib.Config().get("interlock")


def test_config_json_is_flat_and_reads_back():
  preset = config_lib.load_preset("fortunes_lm")
  stored = json.loads(preset.to_json())
  assert set(stored) == {f.name for f in config_lib.flat_fields()}
  assert (stored["variant"], stored["lr_decay_fractions"]) == (
      "sum", list(preset.optim.lr_decay_fractions))
  assert config_lib.from_flat(config_lib.flat(preset)) == preset
  # As train_lib and evaluate read it: lists come back as tuples.
  assert run_io.config_from_dict(stored, "config.json") == preset


def test_an_old_flat_record_with_some_fields_still_loads():
  # A record that predates some fields: they keep their defaults.
  record = {"model": "mlp", "dataset": "synthetic", "num_modules": 2,
            "placement": "simulated", "train_steps": 20, "history": []}
  config = run_io.config_from_dict(record, "config.json")
  assert (config.network.model, config.data.dataset,
          config.interlock.num_modules, config.devices.placement,
          config.run.train_steps) == ("mlp", "synthetic", 2, "simulated", 20)
  assert config.optim == config_lib.OptimizationConfig()


def test_aux_head_takes_every_registered_kind_and_lists_them():
  # Each registered entry's behaviour: the flag takes it (with every model
  # its features fit), lists it in its help and its error.
  for name, kind in aux_heads.KINDS.items():
    config_lib.validate(config_lib.Config(model="resnet", aux_head=name))
    mlp = config_lib.Config(model="mlp", dataset="synthetic", aux_head=name)
    if kind.conv:  # reads image features: refused for the MLP, one line
      with pytest.raises(ValueError, match=f"Received: aux_head='{name}'"):
        config_lib.validate(mlp)
    else:
      config_lib.validate(mlp)
  config_lib.validate(config_lib.Config(aux_head="auto"))
  with pytest.raises(ValueError) as info:
    config_lib.validate(config_lib.Config(aux_head="big"))
  assert all(repr(name) in str(info.value) for name in aux_heads.names())
  assert "big" in str(info.value)
  help_text = {f.name: f.metadata["help"]
               for f in config_lib.flat_fields()}["aux_head"]
  assert aux_heads.describe() in help_text
