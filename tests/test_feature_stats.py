"""step_model.representation (research.feature_stats): a collapsed module's output is told from a healthy
one by its statistics (hand-built features with known answers)."""

import numpy as np
import pytest

from step_model import representation as feature_stats


def _positions(num_tokens=20, repeats=30, seed=0):
  rng = np.random.default_rng(seed)
  return rng.permutation(np.repeat(np.arange(num_tokens), repeats))


def test_distinct_token_embeddings_have_full_rank_and_token_share_one():
  ids = _positions()
  table = np.random.default_rng(1).normal(size=(20, 64))
  stats = feature_stats.feature_stats(table[ids], ids)
  assert stats["token_share"] == pytest.approx(1.0)
  # 20 random directions in 64 dims: the power is spread over most of them.
  assert stats["effective_rank"] > 10 and stats["top_share"] < 0.2
  assert stats["norm"] == pytest.approx(
      np.linalg.norm(table[ids], axis=1).mean())


def test_one_huge_direction_collapses_to_rank_one():
  # h = s(token) * u + small token noise: what 2-wise "only" gave module 1
  # of the fortunes LM. LayerNorm keeps only the sign of s, so the token
  # means span one direction.
  ids = _positions()
  rng = np.random.default_rng(2)
  u = rng.normal(size=64)
  scale = rng.uniform(50, 400, size=20) * rng.choice([-1, 1], size=20)
  h = scale[ids, None] * u + 0.01 * rng.normal(size=(20, 64))[ids]
  stats = feature_stats.feature_stats(h, ids)
  assert stats["effective_rank"] == pytest.approx(1.0, abs=0.01)
  assert stats["top_share"] > 0.99 and stats["norm"] > 100


def test_features_that_ignore_the_token_have_token_share_near_zero():
  ids = _positions()
  h = np.random.default_rng(3).normal(size=(len(ids), 32))
  stats = feature_stats.feature_stats(h, ids)
  # Only chance agreement within each token's 30 positions: about 1/30.
  assert stats["token_share"] < 0.1
