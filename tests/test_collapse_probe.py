"""research.collapse_probe and its measurements (step_model.representation):
angles between h and dL/dh, how h moved, and the LayerNorm ablations, on
hand-built tensors and a tiny Transformer with known answers."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers.transformer import transformer_lm_modules
from tests.binaries import ROOT, run_binary, tree_digest
from tf_interlock import strategy as strategy_lib
from step_model import representation
from research import collapse_probe

# make test-slow (research.collapse_probe's binary end to end).
pytestmark = pytest.mark.slow


def _layer_norm(h):
  centred = h - tf.reduce_mean(h, axis=-1, keepdims=True)
  return centred * tf.math.rsqrt(
      tf.reduce_mean(centred ** 2, axis=-1, keepdims=True) + 1e-12)


def _cotangent(loss_fn, h):
  h = tf.constant(h)
  with tf.GradientTape() as tape:
    tape.watch(h)
    loss = loss_fn(h)
  return tape.gradient(loss, h).numpy()


def _features(n=64, d=32, seed=0):
  return np.random.default_rng(seed).normal(size=(n, d)) * 3.0


def test_layer_norm_invariant_loss_gives_a_cotangent_orthogonal_to_h():
  h = _features()
  w = tf.constant(np.random.default_rng(1).normal(size=(32, 7)))
  g = _cotangent(lambda h: tf.reduce_sum(tf.sin(_layer_norm(h) @ w)), h)
  stats = representation.gradient_alignment(h, g)
  assert stats["cotangent_norm"] > 0.1
  assert abs(stats["cosine"]) < 1e-6
  assert stats["token_abs_cosine"] < 1e-6


def test_scale_sensitive_losses_are_not_orthogonal():
  h = _features()
  # L = sum_i |h_i|^2 / 2: dL/dh = h, every cosine 1.
  g = _cotangent(lambda h: 0.5 * tf.reduce_sum(h ** 2), h)
  stats = representation.gradient_alignment(h, g)
  assert stats["cosine"] == pytest.approx(1.0)
  assert stats["token_cosine"] == pytest.approx(1.0)
  # A pre-LN residual block before a LayerNorm-ed head, as module 2 of the
  # LM: L(LN(h + f(LN(h)))), |f| <= sqrt(d). It depends on the scale of h
  # where |h| and |f| are alike, and tends to invariance in both limits:
  # h dominates h + f when large, f (which reads LN(h)) when small.
  rng = np.random.default_rng(2)
  w_in, w_out = (tf.constant(rng.normal(size=s)) for s in ((32, 32), (32, 7)))
  def alignment(scale):  # rows of h have norm about 5.7 * scale
    g = _cotangent(lambda h: tf.reduce_sum(tf.sin(_layer_norm(
        h + tf.tanh(_layer_norm(h) @ w_in)) @ w_out)), h * scale / 3)
    return representation.gradient_alignment(h, g)["token_abs_cosine"]
  assert alignment(1.0) > 0.03
  assert alignment(100.0) < 0.005 and alignment(0.03) < 0.005


def test_scale_derivative_is_the_derivative_along_h():
  h = _features(8, 6)
  w = np.random.default_rng(3).normal(size=(6, 1))
  def loss(h):
    return tf.reduce_sum(tf.tanh(h @ w))
  g = _cotangent(loss, h)
  eps = 1e-6
  numeric = (loss(h * (1 + eps)) - loss(h * (1 - eps))).numpy() / (2 * eps)
  assert representation.gradient_alignment(h, g)["scale_derivative"] == (
      pytest.approx(numeric, rel=1e-5))


def test_gradient_alignment_refuses_mismatched_shapes():
  with pytest.raises(ValueError, match=r"Received: shapes=\(4, 3\)"):
    representation.gradient_alignment(np.ones((4, 3)), np.ones((4, 2)))


def test_step_stats_tell_growth_from_turning():
  h = _features()
  grown = representation.step_stats(h, 2 * h)
  assert grown["relative_step"] == pytest.approx(1.0)
  assert grown["radial_cosine"] == pytest.approx(1.0)
  assert grown["norm_ratio"] == pytest.approx(2.0)
  # A move orthogonal to h (as a whole): no radial part, the norm still
  # grows by Pythagoras.
  v = _features(seed=4)
  v -= (v * h).sum() / (h * h).sum() * h
  v *= 0.5 * np.linalg.norm(h) / np.linalg.norm(v)
  turned = representation.step_stats(h, h + v)
  assert abs(turned["radial_cosine"]) < 1e-9
  assert turned["relative_step"] == pytest.approx(0.5)
  assert turned["norm_ratio"] == pytest.approx(np.sqrt(1.25))


def test_common_direction_share():
  u = np.random.default_rng(5).normal(size=32)
  assert representation.common_direction_share(np.tile(u, (50, 1))) == (
      pytest.approx(1.0))
  noise = np.random.default_rng(6).normal(size=(2000, 32))
  assert representation.common_direction_share(noise) < 0.01
  # A shared vector holding half the energy of each row.
  mixed = noise / np.sqrt(32) + u / np.linalg.norm(u)
  assert representation.common_direction_share(mixed) == (
      pytest.approx(0.5, abs=0.02))


def test_own_cotangent_follows_the_strategy():
  grads = [np.full(2, 10.0 ** k) for k in range(4)]  # dL_1..dL_4
  def own(name):
    return collapse_probe.own_cotangent(
        strategy_lib.parse_strategy(name), grads)[0]
  assert own("e2e") == 1000.0
  assert own("2wise") == 10.0
  assert own("2wise-sum") == 11.0
  assert own("local") == 1.0
  assert own("3wise-sum") == 111.0


def test_parse_run_and_overrides_refuse_bad_values():
  strategy, ablation = collapse_probe.parse_run("2wise-sum/head_norm_off")
  assert (strategy.name, ablation) == ("2wise-sum", "head_norm_off")
  assert collapse_probe.parse_run("e2e")[1] == "none"
  with pytest.raises(ValueError, match=r"Received: runs='2wise/ln_off'"):
    collapse_probe.parse_run("2wise/ln_off")
  config = collapse_probe.config_lib.load_preset("fortunes_lm")
  assert collapse_probe.parse_overrides(
      ["optimizer=sgd", "learning_rate=0.1"], config) == {
          "optimizer": "sgd", "learning_rate": 0.1}
  with pytest.raises(ValueError, match=r"Received: overrides='lr=0.1'"):
    collapse_probe.parse_overrides(["lr=0.1"], config)


def _tiny_modules(ablation="none"):
  keras.utils.set_random_seed(0)
  modules = transformer_lm_modules(50, 8, 3, 16, 2, 32, 3)
  collapse_probe.ablate_norms(modules[1], ablation)
  ids = tf.constant(np.random.default_rng(7).integers(0, 50, size=(2, 8)))
  h = ids
  for module in modules:
    module.build(h.shape)
    h = module.body(h)
  return modules, ids


def _layer_norms(module):
  # The replaced LayerNorms stay tracked but are never called: never built.
  return [layer for layer in module._flatten_layers()
          if isinstance(layer, keras.layers.LayerNormalization)
          and layer.built]


@pytest.mark.parametrize("ablation, left", [
    ("none", 3), ("block_norms_off", 1), ("head_norm_off", 2),
    ("norms_off", 0)])
def test_ablations_remove_module_2s_layer_norms(ablation, left):
  modules, ids = _tiny_modules(ablation)
  assert len(_layer_norms(modules[1])) == left
  assert len(_layer_norms(modules[0])) == 3  # module 1 untouched
  h1 = modules[0].body(ids)
  h2 = modules[1].body(h1)
  head = modules[1].aux_head
  direct = head.projection(h2) if ablation in (
      "head_norm_off", "norms_off") else head.projection(head.norm(h2))
  np.testing.assert_allclose(head(h2), direct, rtol=1e-6)


def test_probe_gradients_match_a_direct_tape():
  modules, ids = _tiny_modules()
  labels = tf.roll(ids, -1, axis=1)
  h1, values, grads, norms = collapse_probe.make_probe(modules)(ids, labels)
  assert len(values) == len(grads) == 3 and len(norms) == 1
  h1 = tf.identity(h1)
  with tf.GradientTape() as tape:
    tape.watch(h1)
    logits = modules[2].body(modules[1].body(h1))
    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
  np.testing.assert_allclose(values[2], loss, rtol=1e-5)
  np.testing.assert_allclose(grads[2], tape.gradient(loss, h1), rtol=1e-5,
                             atol=1e-6)
  # Each loss has its own cotangent.
  assert not np.allclose(grads[1], grads[2])


def test_unigram_start_covers_every_head_with_smoothed_log_probs():
  modules, _ = _tiny_modules()
  assert [head.name for head in collapse_probe.heads(modules)] == [
      "aux_head1", "aux_head2", "output_head"]
  labels = tf.constant([[0, 0, 1], [0, 2, 2]])
  dataset = tf.data.Dataset.from_tensors((labels, labels)).repeat()
  log_probs = collapse_probe.unigram_log_probs(dataset, 4, 2)
  # Two batches: counts 6, 2, 4, 0, plus one each, over 16.
  np.testing.assert_allclose(np.exp(log_probs), [7 / 16, 3 / 16, 5 / 16,
                                                 1 / 16])


def _foreign_report(tmp_path):
  """A report_dir as research.compare leaves it: its results.json and a
  tables.md of another tool."""
  report = tmp_path / "study"
  report.mkdir()
  (report / "results.json").write_text(json.dumps(
      {"e2e": [{"seed": 0, "steps": 20}], "settings": {"preset": "x"}}))
  (report / "tables.md").write_text("# Not ours\n")
  return report


def test_another_tools_report_dir_is_refused_and_left_unchanged(tmp_path):
  report = _foreign_report(tmp_path)
  before = tree_digest(str(report))
  run = {"command": "python -m research.collapse_probe --runs=2wise",
         "probe_every": 5, "records": []}
  with pytest.raises(ValueError, match="results.json that "
                     "research.collapse_probe did not write"):
    collapse_probe.write_outputs(str(report), {"2wise": run})
  assert tree_digest(str(report)) == before
  # Our own results.json but someone else's tables.md: refused too.
  (report / "results.json").write_text(json.dumps({"e2e": run}))
  before = tree_digest(str(report))
  with pytest.raises(ValueError, match="tables.md that "
                     "research.collapse_probe did not write"):
    collapse_probe.write_outputs(str(report), {"2wise": run})
  assert tree_digest(str(report)) == before
  # The report this binary wrote is read back.
  ours = os.path.join(ROOT, "docs", "results", "lm_collapse")
  assert "2wise" in collapse_probe.read_report(ours)


def test_binary_refuses_a_foreign_report_dir_in_one_line(tmp_path):
  report = _foreign_report(tmp_path)
  before = tree_digest(str(report))
  proc = run_binary("research.collapse_probe", f"--report_dir={report}",
                    "--runs=2wise", "--run_steps=1", check=False)
  assert proc.returncode == 1, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "did not write" in errors[0], proc.stderr
  assert "Traceback" not in proc.stderr
  assert tree_digest(str(report)) == before
