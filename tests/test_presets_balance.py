"""Presets split by measured op time: `profiling.balance_blocks` by hand,
and each balanced preset's split against its committed measurement."""

import json
import os

import pytest

from layers import partition
from step_model import profiling
from step_model.schedule import ModuleCost
from train.presets import fashion_mnist_resnet
from train.presets import fortunes_lm_paper_shape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BALANCE = os.path.join(ROOT, "docs", "results", "balance")


def test_balance_blocks_by_hand():
  # Work per block: f + bx + bw + u = 1 + 0 + 1 + 0 = 2 for the first
  # (no input VJP: it opens module 1), then 3, 3, 9, 3, 3 ms; aux heads
  # (cut costs) of 1 ms after every block.
  blocks = [ModuleCost(1e-3, 0.0, 1e-3, 1e-3)] + [
      ModuleCost(1e-3, 1e-3, 1e-3, 1e-3)] * 2 + [
          ModuleCost(3e-3, 3e-3, 3e-3, 1e-3)] + [
              ModuleCost(1e-3, 1e-3, 1e-3, 1e-3)] * 2
  result = profiling.balance_blocks(blocks, 3)
  assert result["block_work_ms"] == [2.0, 3.0, 3.0, 9.0, 3.0, 3.0]
  assert result["block_cut_ms"] == [1.0] * 6
  # Block 4 alone in module 2 costs 9 + its head 1 = 10, and that is the
  # only split whose largest module costs no more: modules of 8 + 1,
  # 9 + 1 and 6 ms.
  assert result["balanced_split"] == [3, 1, 2]
  assert result["balanced_module_work_ms"] == pytest.approx([9.0, 10.0, 6.0])


def test_compose_modules_sums_blocks_and_their_inner_vjps():
  blocks = [ModuleCost(1.0, 0.0, 2.0, 0.5, 0.1),
            ModuleCost(1.0, 3.0, 2.0, 0.7, 0.1),
            ModuleCost(1.0, 3.0, 2.0, 0.6, 0.1),
            ModuleCost(1.0, 3.0, 2.0, 0.0, 0.1)]
  first, last = profiling.compose_modules(blocks, [2, 2])
  # Module 1: no input VJP; its weight VJP carries the cotangent through
  # block 2 to block 1 (3) besides both weight VJPs (2 + 2); the aux head
  # measured after block 2.
  assert first == ModuleCost(2.0, 0.0, 7.0, 0.7, 0.2)
  # Module 2: input VJP through both blocks (3 + 3), weight VJP 2 + 2 plus
  # the inner 3, no aux head.
  assert last == ModuleCost(2.0, 6.0, 7.0, 0.0, 0.2)
  with pytest.raises(ValueError):
    profiling.compose_modules(blocks, [2, 1])


def test_projection_against_the_pipeline():
  costs = [ModuleCost(1.0, 1.0, 1.0)] * 4
  out = profiling.project_one_core_per_module(costs)
  # e2e: F1..F4, BX4..BX2, BW1 = 8 units; local: each device's f + bw (+ its
  # aux of 0) = 2 units, input VJPs skipped.
  assert out["e2e_ms"] == pytest.approx(8000.0)
  assert out["local"]["step_ms"] == pytest.approx(2000.0)
  assert out["local"]["vs_e2e"] == pytest.approx(4.0)
  assert out["local"]["vs_pipeline"] == pytest.approx(
      out["pipeline_ms"] / 2000.0)
  assert 3000.0 < out["pipeline_ms"] < 8000.0


@pytest.mark.parametrize("preset,artifact", [
    (fashion_mnist_resnet, "fashion_mnist_resnet.json"),
    (fortunes_lm_paper_shape, "fortunes_lm_paper_shape.json"),
])
def test_preset_split_is_the_measured_balance(preset, artifact):
  with open(os.path.join(BALANCE, artifact)) as f:
    measured = json.load(f)
  config = preset.get_config()
  split = partition.balanced_split(measured["block_work_ms"],
                                   config.interlock.num_modules,
                                   cut_costs=measured["block_cut_ms"])
  assert list(config.interlock.split) == split == measured["balanced_split"]
