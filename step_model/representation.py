"""Statistics of one module's output: is it still readable per token?

Used by `research.feature_stats`. A collapsed module (2-wise "only" on the
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


def _row_cosines(a, b):
  """Cosine between matching rows of a and b [N, d]; 0 for a zero row."""
  dots = (a * b).sum(axis=1)
  norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
  return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


def _cosine(a, b):
  norm = np.linalg.norm(a) * np.linalg.norm(b)
  return float((a * b).sum() / norm) if norm else 0.0


def gradient_alignment(features, cotangent):
  """How much of a cotangent dL/dh points along h itself.

  <dL/dh_i, h_i> = dL/ds_i at s_i = 1 for h_i -> s_i h_i: the loss's
  sensitivity to the scale of position i. A loss that sees h only through a
  LayerNorm is invariant to every s_i, so each row's cosine is exactly 0 and
  a gradient step can only rotate h_i or, being orthogonal, lengthen it
  (|h + e g|^2 = |h|^2 + e^2 |g|^2). A random direction in d dimensions
  has |cosine| about sqrt(2 / (pi d)) (0.07 for d = 128).

  Args:
    features: [N, d] h, one row per token position.
    cotangent: [N, d] dL/dh at the same positions.

  Returns:
    {"cosine": cosine of the flattened tensors, "token_cosine": mean of the
    per-row cosines, "token_abs_cosine": mean of their absolute values,
    "cotangent_norm": mean row norm of dL/dh, "scale_derivative":
    sum_i <g_i, h_i>, the derivative of L when every h_i is scaled by s}.
  """
  h = np.asarray(features, np.float64)
  g = np.asarray(cotangent, np.float64)
  if h.shape != g.shape or h.ndim != 2:
    raise ValueError(f"features and cotangent must both be [N, d]. "
                     f"Received: shapes={h.shape} and {g.shape}")
  rows = _row_cosines(h, g)
  return {"cosine": _cosine(h, g),
          "token_cosine": float(rows.mean()),
          "token_abs_cosine": float(np.abs(rows).mean()),
          "cotangent_norm": float(np.linalg.norm(g, axis=1).mean()),
          "scale_derivative": float((h * g).sum())}


def step_stats(before, after):
  """How far h moved between two probes, relative to its size.

  Args:
    before: [N, d] h at one probe.
    after: [N, d] h on the same inputs at a later probe.

  Returns:
    {"relative_step": |after - before| / |before| (Frobenius),
    "radial_cosine": cosine between the move and `before` (+1: h only
    grew, 0: it only turned), "norm_ratio": |after| / |before|}.
  """
  before = np.asarray(before, np.float64)
  delta = np.asarray(after, np.float64) - before
  size = np.linalg.norm(before)
  return {"relative_step": float(np.linalg.norm(delta) / size),
          "radial_cosine": _cosine(delta, before),
          "norm_ratio": float(np.linalg.norm(before + delta) / size)}


def common_direction_share(features):
  """|mean_i h_i|^2 / mean_i |h_i|^2, in [0, 1].

  The share of h's energy in the one vector shared by every position: 1
  when all rows are the same vector, about 1/N for independent random rows.
  A LayerNorm subtracts each row's own mean over d, not this one, so a large
  shared vector survives it and swamps what differs between tokens.
  """
  h = np.asarray(features, np.float64)
  energy = float((h ** 2).sum(axis=1).mean())
  return float((h.mean(axis=0) ** 2).sum() / energy) if energy else 0.0
