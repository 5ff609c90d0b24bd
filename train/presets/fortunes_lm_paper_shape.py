"""The paper's Transformer shape on Debian's fortunes: K = 4 modules of 3
pre-LayerNorm blocks each (12 blocks, width 256), 2-wise sum, Adam.

The `fortunes_lm` preset has one block of width 128 per module, so each
aux head (LayerNorm + a 128 x 2,000 projection and its softmax) costs more
than its module's block: the heads bound every interlocked schedule. Here a
module holds 3 blocks twice as wide (12 d^2 weights each against d V for
the head), so the head is a small fraction of its module's work, as in
Gomez et al. (2022, Sec. 5.2), where modules hold several blocks of a
12-block Transformer. `python -m research.module_costs
--preset=fortunes_lm_paper_shape --balance_into=4 --repetitions=3` measures
every block and splits by measured time (`profiling.balance_blocks`); its
output goes to docs/results/balance/fortunes_lm_paper_shape.json.
"""

import dataclasses

from train.presets import fortunes_lm


def get_config():
  return dataclasses.replace(
      fortunes_lm.get_config(), num_layers=12, d_model=256, num_heads=4,
      mlp_dim=1024, split=(3, 3, 3, 3))
