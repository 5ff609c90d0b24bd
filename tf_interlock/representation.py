"""Statistics of one module's output: is it still readable per token?

Used by `train.feature_stats`. A collapsed module (2-wise "only" on the
fortunes LM, docs/results/study_fortunes_lm/reading.md) shows a norm far
above e2e's and an effective rank near 1.
"""

import numpy as np


def feature_stats(features, token_ids, epsilon=1e-5):
  """Statistics of one module's output over many token positions.

  Args:
    features: [N, d] outputs h_k, one row per token position.
    token_ids: [N] the input token at each position.
    epsilon: LayerNorm's epsilon.

  Returns:
    {"norm": mean |h|, "token_share": variance of LayerNorm(h) explained by
    the token, "effective_rank": participation ratio of the per-token means'
    squared singular values, "top_share": the top direction's share}.
  """
  features = np.asarray(features, np.float64)
  token_ids = np.asarray(token_ids)
  norm = float(np.linalg.norm(features, axis=1).mean())
  # LayerNorm without its affine part: what every head reads first.
  z = features - features.mean(axis=1, keepdims=True)
  z = z / np.sqrt(z.var(axis=1, keepdims=True) + epsilon)
  z = z - z.mean(axis=0)
  tokens, inverse = np.unique(token_ids, return_inverse=True)
  means = np.zeros((len(tokens), z.shape[1]))
  np.add.at(means, inverse, z)
  means /= np.bincount(inverse)[:, None]
  total = float((z ** 2).sum(axis=1).mean())
  between = float((means[inverse] ** 2).sum(axis=1).mean())
  centred = means - means.mean(axis=0)
  power = np.linalg.svd(centred, compute_uv=False) ** 2
  return {"norm": norm,
          "token_share": between / total if total else 0.0,
          "effective_rank": float(power.sum() ** 2 / (power ** 2).sum()),
          "top_share": float(power[0] / power.sum())}
