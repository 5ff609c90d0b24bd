r"""What happens to module 1 of a Transformer LM, step by step, per strategy.

  python -m research.collapse_probe --runs=e2e,2wise,2wise-sum \
      --run_steps=150 --report_dir=docs/results/lm_collapse

Trains each run of --runs from the same initialisation and data order (the
--lm_preset network on one device) and, every --probe_every steps, puts one
fixed validation batch through the modules and records, for module 1's
output h_1: its mean norm, the share of its energy in one vector shared by
every position, its effective rank as LayerNorm-ed heads see it
(`representation.feature_stats`), how far it moved since the previous probe
relative to its size and in which direction (`representation.step_stats`),
and the cosine between h_1 and each cotangent dL_k/dh_1, k = 1..K
(`representation.gradient_alignment`), including "own": the one that
trains module 1 under the run's strategy (L_2 for 2-wise "only", L_1 + L_2
for "sum", L_K for e2e). Module 1's weight norms and their relative change
are recorded too.

A run is STRATEGY or STRATEGY/ABLATION; an ablation changes module 2 only,
the module whose loss trains module 1 under 2-wise:
  block_norms_off  its blocks read h_1 without LayerNorm (x + Attn(x), ...)
  head_norm_off    its aux head is a projection of h_2 without LayerNorm
  norms_off        both
and one changes the start of every head instead:
  unigram_bias     every head's logit bias starts at the training split's
                   unigram log-probabilities (add-one smoothed), so no
                   module has to learn token frequencies
The learning-rate schedule is that of a --schedule_steps run (the study's
300), so a short run sees the study's first steps exactly.

Each finished run is merged into <report_dir>/results.json (by name) and
tables.md is rewritten from all of them.
"""
# First: quiets TF's logging before TensorFlow loads (see runtime_env).
from train import runtime_env  # pylint: disable=unused-import

import dataclasses
import json
import os

from absl import app
from absl import flags
import keras
import numpy as np
import tensorflow as tf

from layers.aux_heads import SequenceAuxHead
from layers.transformer import TransformerBlock
from tf_interlock import losses
from tf_interlock import routing
from tf_interlock import strategy as strategy_lib
from tf_interlock.trainer import InterlockTrainer
from step_model import representation
from train import config as config_lib
from train import datasets
from train import error_boundary
from train import networks
from train import optimization
from train import owned_dir
from train import runtime_setup
from train import user_files

ABLATIONS = ("none", "block_norms_off", "head_norm_off", "norms_off",
             "unigram_bias")
# Training batches counted for the unigram_bias start.
UNIGRAM_BATCHES = 100
# Steps at which tables.md shows each run.
TABLE_STEPS = (0, 10, 20, 30, 40, 60, 80, 100, 150, 200, 300)

_RUNS = flags.DEFINE_list(
    "runs", ["e2e", "2wise", "2wise-sum"],
    "Runs, comma-separated: STRATEGY or STRATEGY/ABLATION, ABLATION one "
    f"of {ABLATIONS}.")
_LM_PRESET = flags.DEFINE_string(
    "lm_preset", "fortunes_lm", "train/presets name of the Transformer "
    "language model every run trains (on one device).")
_RUN_STEPS = flags.DEFINE_integer(
    "run_steps", 150, "Training steps (>= 1) of each run, from the "
    "same initialisation and data order.")
_SCHEDULE_STEPS = flags.DEFINE_integer(
    "schedule_steps", 300, "Steps (>= 1) of the run whose learning-rate "
    "schedule every run follows (the study's 300).")
_PROBE_EVERY = flags.DEFINE_integer(
    "probe_every", 5, "Training steps (>= 1) between two probes of module "
    "1's output h_1.")
_INIT_SEED = flags.DEFINE_integer(
    "init_seed", 0, "Seed of every run's initial weights and data order "
    "(the same for all runs).")
_OVERRIDES = flags.DEFINE_list(
    "overrides", [], "Config fields for every run, e.g. optimizer=sgd,"
    "learning_rate=0.1; the run's name gets them as a suffix.")
_REPORT_DIR = flags.DEFINE_string(
    "report_dir", "runs/lm_collapse", "Folder of results.json (merged by "
    "run name) and tables.md (rewritten).")
# What this binary writes first: how its report is told from another's.
_COMMAND = "python -m research.collapse_probe"
# The same binary before the research tools left train/ (older reports).
_FORMER_COMMANDS = ("python -m train.collapse_probe",)
_TABLES_HEADER = "# Module 1 per step (written by research.collapse_probe)"


def parse_run(spec):
  """'2wise/block_norms_off' -> (InterlockStrategy, ablation)."""
  strategy, _, ablation = spec.partition("/")
  ablation = ablation or "none"
  if ablation not in ABLATIONS:
    raise ValueError(f"A run's ablation must be one of {ABLATIONS}. "
                     f"Received: runs={spec!r}")
  return strategy_lib.parse_strategy(strategy), ablation


def parse_overrides(items, config):
  """['optimizer=sgd', 'learning_rate=0.1'] -> {field: typed value}."""
  fields = {f.name for f in config.flat_fields()}
  parsed = {}
  for item in items:
    name, sep, text = item.partition("=")
    if not sep or name not in fields:
      raise ValueError(f"overrides must be FIELD=VALUE with a Config field. "
                       f"Received: overrides={item!r}")
    kind = type(config.get(name))
    parsed[name] = kind(text) if kind in (int, float, str) else text
  return parsed


def ablate_norms(module, ablation):
  """Replaces LayerNorms of an unbuilt Transformer module by Identity."""
  if ablation in ("block_norms_off", "norms_off"):
    blocks = [layer for layer in module.body.layers
              if isinstance(layer, TransformerBlock)]
    if not blocks:
      raise ValueError(f"Module {module.name!r} has no Transformer block. "
                       f"Received: ablation={ablation!r}")
    for block in blocks:
      block.norm1 = keras.layers.Identity(name="norm1_off")
      block.norm2 = keras.layers.Identity(name="norm2_off")
  if ablation in ("head_norm_off", "norms_off"):
    module.aux_head.norm = keras.layers.Identity(name="norm_off")


def heads(modules):
  """Every `SequenceAuxHead`: the aux heads and module K's output head."""
  found = [m.aux_head for m in modules if m.has_aux_head]
  return found + [layer for layer in modules[-1].body.layers
                  if isinstance(layer, SequenceAuxHead)]


def unigram_log_probs(dataset, vocab_size, batches):
  """log p(token), add-one smoothed, over `batches` (ids, labels) batches."""
  counts = np.ones(vocab_size)
  for _, labels in dataset.take(batches):
    counts += np.bincount(labels.numpy().ravel(), minlength=vocab_size)
  return np.log(counts / counts.sum())


def own_cotangent(strategy, grads):
  """The cotangent that trains module 1: the sum of dL_j/dh_1 over the
  losses j that train it (`RoutingPlan.losses_training(0)`: L_t alone under
  "only", L_1..L_t under "sum", t = target(1)); grads[k] = dL_{k+1}/dh_1."""
  plan = routing.make_plan(strategy, len(grads))
  losses = plan.losses_training(0)
  if len(losses) == 1:
    return grads[losses[0]]
  return sum(grads[j] for j in losses)


def make_probe(modules):
  """tf.function ids, labels -> (h_1, [L_k], [dL_k/dh_1], [|h_k|, k >= 2]).

  Module bodies are called directly: `InterlockModule.forward` cuts its
  input, and here the gradients must reach h_1.
  """
  def loss(labels, logits):
    return tf.reduce_mean(losses.sparse_softmax_cross_entropy(labels, logits))

  @tf.function(autograph=False)
  def probe(ids, labels):
    h1 = modules[0].body(ids)
    norms = []
    with tf.GradientTape(persistent=True) as tape:
      tape.watch(h1)
      values = [loss(labels, modules[0].aux_logits(h1))]
      h = h1
      for module in modules[1:]:
        h = module.body(h)
        if module.has_aux_head:
          norms.append(tf.reduce_mean(tf.norm(h, axis=-1)))
          values.append(loss(labels, module.aux_logits(h)))
        else:
          values.append(loss(labels, h))
    grads = [tape.gradient(value, h1) for value in values]
    return h1, values, grads, norms
  return probe


def _rows(tensor):
  return tf.reshape(tensor, [-1, tensor.shape[-1]]).numpy()


def measure(probe, batch, strategy):
  """One probe's record of h_1 on `batch`, and h_1 [N, d]."""
  ids, labels = batch
  h1, values, grads, norms = probe(ids, labels)
  h = _rows(h1)
  grads = [_rows(g) for g in grads]
  stats = representation.feature_stats(h, tf.reshape(ids, [-1]).numpy())
  cotangents = {f"L{k + 1}": g for k, g in enumerate(grads)}
  cotangents["own"] = own_cotangent(strategy, grads)
  record = {
      "losses": [float(v) for v in values],
      "h1_norm": stats["norm"],
      "h_norms": [float(n) for n in norms],
      "common_direction_share": representation.common_direction_share(h),
      "effective_rank": stats["effective_rank"],
      "top_share": stats["top_share"],
      "token_share": stats["token_share"],
      "alignment": {name: representation.gradient_alignment(h, g)
                    for name, g in cotangents.items()}}
  return record, h


def weight_record(module, previous):
  """({short name: {"norm", "relative_change"}}, {short name: value}).

  relative_change is |w - w_prev| / |w_prev| against `previous` (the
  values of the last probe; None at the first)."""
  record, values = {}, {}
  for variable in module.trainable_weights:
    name = "/".join(variable.path.split("/")[-3:])
    values[name] = value = variable.numpy()
    record[name] = {"norm": float(np.linalg.norm(value))}
    if previous is not None:
      record[name]["relative_change"] = float(
          np.linalg.norm(value - previous[name]) /
          max(np.linalg.norm(previous[name]), 1e-12))
  return record, values


def run_one(base, spec, steps, schedule_steps, probe_every, out=print):
  """Trains run `spec` for `steps` steps; its list of probe records."""
  strategy, ablation = parse_run(spec)
  config = dataclasses.replace(base, strategy=strategy.name,
                               variant=strategy.variant, placement="single")
  runtime_setup.setup_runtime(config)  # seeds: every run starts the same
  task = datasets.make_task(config)
  # Again after the data: a first run's data step draws from Python's
  # random, which seeds Keras's initializers (train_lib.build says more).
  runtime_setup.seed(config)
  modules = networks.make_modules(config, task)
  if len(modules) < 3:
    raise ValueError(f"The probe needs K >= 3 modules (L_2 and L_K apart). "
                     f"Received: num_modules={len(modules)}")
  if ablation != "unigram_bias":
    ablate_norms(modules[1], ablation)
  trainer = InterlockTrainer(
      modules, lambda k: optimization.make_optimizer(config, schedule_steps),
      config.interlock.strategy, variant=config.interlock.variant, steps_per_loop=1)
  trainer.build(next(iter(task.train.take(1)))[0])
  if ablation == "unigram_bias":
    log_probs = unigram_log_probs(task.train, task.num_classes,
                                  UNIGRAM_BATCHES)
    for head in heads(modules):
      head.projection.bias.assign(log_probs)
  batch = next(iter(task.eval.take(1)))
  iterator = iter(trainer.distribute_dataset(task.train))
  probe = make_probe(modules)
  records, h_prev, weights = [], None, None
  for step in range(0, steps + 1, probe_every):
    record, h = measure(probe, batch, strategy)
    if h_prev is not None:
      record["step"] = representation.step_stats(h_prev, h)
    record["weights"], weights = weight_record(modules[0], weights)
    record.update(step_index=step, learning_rate=float(
        trainer.optimizers[0].learning_rate.numpy()))
    records.append(record)
    own = record["alignment"]["own"]
    out(f"{spec} step {step}: |h1| {record['h1_norm']:.3g} L "
        f"{[round(v, 3) for v in record['losses']]} own cos "
        f"{own['token_cosine']:+.3f} |cos| {own['token_abs_cosine']:.3f} "
        f"rank {record['effective_rank']:.2f}")
    h_prev = h
    if step + probe_every > steps:
      break
    for _ in range(probe_every):
      trainer.train_loop(iterator, 1)
  return records


def run_name(spec, overrides, seed):
  """The run's key in results.json: the spec, overrides, a seed but 0's."""
  return spec + "".join(f",{item}" for item in overrides) + (
      f",seed={seed}" if seed else "")


def _cell(value):
  return f"{value:.3g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"


def run_table(records, probe_every):
  """Markdown rows of one run at TABLE_STEPS."""
  lines = [
      "| step | lr | \\|h_1\\| | shared-vector share | eff. rank | own cos "
      "(mean per token) | own \\|cos\\| | own cos (all) | \\|dL/dh_1\\| | "
      f"\\|Δh_1\\|/\\|h_1\\| per {probe_every} steps | radial cos of Δh_1 | "
      "L_1 | L_2 | L_K |",
      "|" + "---|" * 14]
  for record in records:
    if record["step_index"] not in TABLE_STEPS:
      continue
    own = record["alignment"]["own"]
    move = record.get("step", {})
    cells = [record["step_index"], record["learning_rate"],
             record["h1_norm"], record["common_direction_share"],
             record["effective_rank"], own["token_cosine"],
             own["token_abs_cosine"], own["cosine"], own["cotangent_norm"],
             move.get("relative_step"), move.get("radial_cosine"),
             record["losses"][0], record["losses"][1], record["losses"][-1]]
    lines.append("| " + " | ".join(
        "-" if c is None else str(c) if isinstance(c, int) else _cell(c)
        for c in cells) + " |")
  return lines


def weight_table(records, top=6):
  """Markdown rows: module 1's weights that grew most over the run."""
  first, last = records[0]["weights"], records[-1]["weights"]
  # Biases and LayerNorm offsets start at 0: ratios only for the others.
  growth = sorted((n for n in first if first[n]["norm"] > 0),
                  key=lambda n: -last[n]["norm"] / first[n]["norm"])
  lines = ["| weight of module 1 | norm at step 0 | norm at the end | ratio |",
           "|---|---|---|---|"]
  for name in growth[:top]:
    a, b = first[name]["norm"], last[name]["norm"]
    lines.append(f"| {name} | {_cell(a)} | {_cell(b)} | {_cell(b / a)} |")
  return lines


def _is_probe_run(run):
  """Whether `run` is an entry this binary wrote into results.json."""
  return (isinstance(run, dict) and
          {"command", "probe_every", "records"} <= set(run) and
          str(run["command"]).startswith((_COMMAND,) + _FORMER_COMMANDS))


def read_report(report_dir):
  """The runs in report_dir/results.json ({} if none), refusing others'.

  Raises:
    ValueError: results.json or tables.md there was not written by this
      binary (another tool's report): nothing is written over it.
  """
  path = os.path.join(report_dir, "results.json")
  tables = os.path.join(report_dir, "tables.md")
  runs = {}
  if tf.io.gfile.exists(path):
    try:
      runs = owned_dir.load_json(path)
    except ValueError:
      runs = None
    if not isinstance(runs, dict) or not all(
        _is_probe_run(run) for run in runs.values()):
      raise ValueError(
          f"--report_dir holds a results.json that research.collapse_probe did "
          f"not write ({path}); pick another --report_dir, nothing was "
          f"changed. Received: report_dir={report_dir}")
  if tf.io.gfile.exists(tables):
    with tf.io.gfile.GFile(tables) as f:
      head = f.read(len(_TABLES_HEADER))
    if head != _TABLES_HEADER:
      raise ValueError(
          f"--report_dir holds a tables.md that research.collapse_probe did "
          f"not write ({tables}); pick another --report_dir, nothing was "
          f"changed. Received: report_dir={report_dir}")
  return runs


def write_outputs(report_dir, results):
  """Merges `results` (name -> run) into results.json; rewrites tables.md.

  Raises:
    ValueError: report_dir holds another tool's outputs (`read_report`).
  """
  merged = read_report(report_dir)
  tf.io.gfile.makedirs(report_dir)
  path = os.path.join(report_dir, "results.json")
  merged.update(results)
  user_files.write_output(path, json.dumps(merged, indent=1), "--report_dir")
  lines = [_TABLES_HEADER, "",
           "own: the cotangent that trains module 1 under the run's "
           "strategy. Probe: one fixed validation batch.", ""]
  for name, run in merged.items():
    lines += [f"## {name}", "", f"`{run['command']}`", ""]
    lines += run_table(run["records"], run["probe_every"]) + [""]
    lines += weight_table(run["records"]) + [""]
  user_files.write_output(os.path.join(report_dir, "tables.md"),
                          "\n".join(lines), "--report_dir")


@error_boundary.guard()
def main(argv):
  del argv
  base = config_lib.load_preset(_LM_PRESET.value)
  if not base.is_text or base.network.model != "transformer":
    raise app.UsageError(f"--lm_preset must be a Transformer LM preset. "
                         f"Received: lm_preset={_LM_PRESET.value!r}")
  for flag, value in (("run_steps", _RUN_STEPS.value),
                      ("probe_every", _PROBE_EVERY.value),
                      ("schedule_steps", _SCHEDULE_STEPS.value)):
    if value < 1:
      raise app.UsageError(f"--{flag} must be >= 1. "
                           f"Received: {flag}={value}")
  try:
    specs = [(spec, parse_run(spec)) for spec in _RUNS.value]
    overrides = parse_overrides(_OVERRIDES.value, base)
  except ValueError as error:
    raise app.UsageError(str(error)) from None
  base = dataclasses.replace(base, seed=_INIT_SEED.value, **overrides)
  read_report(_REPORT_DIR.value)  # refuses another tool's report up front
  for spec, _ in specs:
    name = run_name(spec, _OVERRIDES.value, _INIT_SEED.value)
    records = run_one(base, spec, _RUN_STEPS.value, _SCHEDULE_STEPS.value,
                      _PROBE_EVERY.value)
    command = (f"{_COMMAND} --runs={spec} "
               f"--lm_preset={_LM_PRESET.value} --run_steps={_RUN_STEPS.value} "
               f"--schedule_steps={_SCHEDULE_STEPS.value} "
               f"--probe_every={_PROBE_EVERY.value} "
               f"--init_seed={_INIT_SEED.value}" +
               (f" --overrides={','.join(_OVERRIDES.value)}"
                if _OVERRIDES.value else ""))
    write_outputs(_REPORT_DIR.value, {name: {
        "command": command, "probe_every": _PROBE_EVERY.value,
        "records": records}})


if __name__ == "__main__":
  app.run(main)
