r"""Speed of real models users bring: plain Keras fit vs InterlockModel.fit.

  python -m research.real_models --models=gpt2,bert,mobilenet_v2 \
      --layouts=k2,k4 --strategies=e2e,local,2wise --json_out=real.json

Three models with random weights and random data (issue 45's speed table):
keras_hub's GPT2CausalLM and BertTextClassifier from small backbones, and
keras.applications' MobileNetV2 (include_top=False) nested as a base with
pooling and a Dense head. Each is trained

* by plain Keras `fit`, in a process of its own with TF's default
  threading on every core: what the user runs without tf_interlock;
* split by `from_keras` into K modules, by `InterlockModel.fit` with each
  strategy on each layout: "k2" is K = 2 on 2 logical CPU devices x 1
  intra-op thread (the fair layout for 2 cores), "k4" K = 4 on 4 such
  devices; the devices are set up before TF's runtime starts, as the
  binaries set up --placement=simulated.

Each cell (model x plain Keras, or model x layout x strategy) runs in a
fresh process (this binary again, --role=cell), so no cell profits from
another's traced functions. Per cell: the first fit call's wall time (it
traces), then the steady steps/s (median over --calls fit calls of --steps
steps after warm-ups), and both as ratios against plain Keras on the same
model, beside issue 45's goals.
"""

import json
import sys

from train import runtime_env  # noqa: F401  (before TensorFlow)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

import tf_interlock as ti  # noqa: E402
from research import benchmark_lib  # noqa: E402
from research import real_models_lib as lib  # noqa: E402
from tf_interlock import execution_options  # noqa: E402
from train import config as config_lib  # noqa: E402
from train import error_boundary  # noqa: E402
from train import user_files  # noqa: E402

_MODELS = flags.DEFINE_list(
    "models", list(lib.MODELS), f"Models to time, comma-separated, of "
    f"{', '.join(lib.MODELS)} (random weights, random data).")
_LAYOUTS = flags.DEFINE_list(
    "layouts", ["k2", "k4"], "Layouts of the strategies, comma-separated: "
    "kN is K = N modules on N simulated CPU devices x 1 intra-op thread "
    "(k2: the fair layout for 2 cores); kNhost is K = N modules on the "
    "one default device with TF's default threading (no placement: the "
    "fair layout for e2e).")
_STRATEGIES = flags.DEFINE_list(
    "strategies", ["e2e", "local", "2wise"], "Strategies trained by "
    "InterlockModel.fit on every layout, comma-separated (e2e, local, "
    "2wise, Nwise; NAME-mM: M microbatches per step).")
_STEPS = flags.DEFINE_integer(
    "steps", 8, "Training steps per timed fit call (>= 1).")
_STEPS_PER_EXECUTION = flags.DEFINE_integer(
    "steps_per_execution", 8, "compile(steps_per_execution=) of plain Keras "
    "and of every InterlockModel: steps per traced call (>= 1).")
_CALLS = flags.DEFINE_integer(
    "calls", 3, "Timed fit calls per cell after the first and the warm-ups "
    "(>= 1); their median is reported.")
_BATCH = flags.DEFINE_integer(
    "batch_size", 8, "Examples (sequences, images) per step, every cell "
    "(>= 1).")
_NUM_LAYERS = flags.DEFINE_integer(
    "num_layers", 4, "Transformer layers of GPT-2 and BERT (>= 1).")
_HIDDEN = flags.DEFINE_integer(
    "hidden_dim", 256, "Hidden size of GPT-2 and BERT (>= 1; divisible by "
    "--num_heads); their feed-forward size is 4x.")
_HEADS = flags.DEFINE_integer(
    "num_heads", 4, "Attention heads of GPT-2 and BERT (>= 1).")
_SEQ_LEN = flags.DEFINE_integer(
    "seq_len", 128, "Tokens per sequence of GPT-2 and BERT (>= 1).")
_VOCAB = flags.DEFINE_integer(
    "vocab_size", 5000, "Vocabulary of GPT-2 and BERT (>= 2); random ids.")
_IMAGE = flags.DEFINE_integer(
    "image_size", 96, "Height and width of MobileNetV2's random images, "
    "in pixels (>= 32).")
_CLASSES = flags.DEFINE_integer(
    "num_classes", 10, "Classes of BERT's and MobileNetV2's heads (>= 2).")
_E2E_AUX = flags.DEFINE_bool(
    "e2e_aux_heads", False, "Give e2e modules aux heads (probes: work "
    "plain Keras does not do); by default e2e splits without them.")
_AUTOTUNE = flags.DEFINE_bool(
    "data_autotune", False, "tf.data autotuning of the random dataset "
    "every cell's fit reads (off: Keras's iterator teardown waits for the "
    "autotuner, docs/results/fit_speed).")
_LOOP = flags.DEFINE_enum(
    "loop", "auto", list(execution_options.LOOPS), "ExecutionOptions.loop "
    "of every strategy cell: how a training call runs its steps "
    "(tf_interlock/execution_options.py).")
_LOOP_BLOCK = flags.DEFINE_integer(
    "loop_block", 1, "ExecutionOptions.loop_block of every strategy cell: "
    "steps (pipelined: iterations) per trip of a loop (>= 1; > 1 needs "
    "--loop=while or pipelined).")
_ROLE = flags.DEFINE_string(
    "role", "main", "Internal: main (every cell, each in a child process) "
    "or cell (one --cell of the one --models and --layouts value here).")
_CELL = flags.DEFINE_string(
    "cell", lib.KERAS, "Internal, role=cell: 'keras' (plain Keras fit) or "
    "a strategy of --strategies.")
_JSON_OUT = flags.DEFINE_string(
    "json_out", None, "Also write the JSON report to this file (gfile path).")

# The flags every cell's process is given as they are.
_CELL_FLAGS = ("steps", "steps_per_execution", "calls", "batch_size",
               "num_layers", "hidden_dim", "num_heads", "seq_len",
               "vocab_size", "image_size", "num_classes", "e2e_aux_heads",
               "data_autotune", "loop", "loop_block")


def validate():
  """One-line errors for bad flags, before anything runs (the numbers'
  bounds are their help's, held by the error boundary)."""
  config_lib.check_choice("role", _ROLE.value, ("main", "cell"))
  for flag in (_MODELS, _LAYOUTS, _STRATEGIES):
    if not flag.value:
      config_lib.fail(flag.name, "", "must name at least one")
    if _ROLE.value == "cell" and flag is not _STRATEGIES and (
        len(flag.value) != 1):
      config_lib.fail(flag.name, ",".join(flag.value),
                      "must be one value with --role=cell")
  for name in _MODELS.value:
    config_lib.check_choice("models", name, lib.MODELS)
  for name in _LAYOUTS.value:
    if lib.layout_modules(name) is None:
      config_lib.fail("layouts", name, "must be kN or kNhost for an int "
                      "N >= 1 (K = N modules on N simulated devices, or on "
                      "the one default device), e.g. k2")
  modules = sorted({lib.layout_modules(name) for name in _LAYOUTS.value})
  benchmark_lib.check_cells(_STRATEGIES.value, _BATCH.value,
                            num_modules=modules, loop=_LOOP.value)
  if _ROLE.value == "cell" and _CELL.value != lib.KERAS:
    benchmark_lib.check_cells([_CELL.value], _BATCH.value, flag="cell")
  if _LOOP_BLOCK.value > 1 and _LOOP.value not in ("while", "pipelined"):
    config_lib.fail("loop_block", _LOOP_BLOCK.value,
                    f"must be 1 unless --loop=while or pipelined "
                    f"(--loop={_LOOP.value})")
  if _HIDDEN.value % _HEADS.value:
    config_lib.fail("hidden_dim", _HIDDEN.value,
                    f"must be divisible by --num_heads={_HEADS.value}")
  if _JSON_OUT.value and _ROLE.value == "main":  # before minutes of timing
    benchmark_lib.check_json_out(_JSON_OUT.value)


def sizes():
  return lib.Sizes(
      num_layers=_NUM_LAYERS.value, hidden_dim=_HIDDEN.value,
      num_heads=_HEADS.value, seq_len=_SEQ_LEN.value,
      vocab_size=_VOCAB.value, image_size=_IMAGE.value,
      num_classes=_CLASSES.value, batch_size=_BATCH.value)


def run_child(model, cell, layout):
  """One cell in a fresh process: its row; a failed cell's row holds the
  child's last line of stderr as "error" (the other cells still run)."""
  args = [f"--{n}={flags.FLAGS[n].value}" for n in _CELL_FLAGS]
  # Progress on stderr: the whole table takes many minutes.
  print(f"cell: {model} {cell}" + ("" if cell == lib.KERAS else
                                   f" on {layout}"), file=sys.stderr,
        flush=True)
  try:
    return benchmark_lib.run_child(
        [*args, "--role=cell", f"--models={model}", f"--layouts={layout}",
         f"--cell={cell}"], module="research.real_models")
  except RuntimeError as e:
    return {"model": model, "strategy": cell,
            "layout": None if cell == lib.KERAS else layout,
            # The child's own line, after "... failed (rc N): error: ".
            "error": str(e).split(" failed (rc ", 1)[-1].split(
                "): ", 1)[-1].removeprefix("error: ")}


def main_report():
  """Every model's plain Keras cell, then its layouts x strategies."""
  cells = []
  for model in dict.fromkeys(_MODELS.value):
    cells.append(run_child(model, lib.KERAS, _LAYOUTS.value[0]))
    for layout in dict.fromkeys(_LAYOUTS.value):
      for strategy in dict.fromkeys(_STRATEGIES.value):
        cells.append(run_child(model, strategy, layout))
  lib.add_ratios(cells)
  return {"sizes": vars(sizes()), "steps": _STEPS.value,
          "steps_per_execution": _STEPS_PER_EXECUTION.value,
          "calls": _CALLS.value, "e2e_aux_heads": _E2E_AUX.value,
          "data_autotune": _AUTOTUNE.value, "goals": lib.GOALS_TEXT,
          "loop": _LOOP.value, "loop_block": _LOOP_BLOCK.value,
          "onednn": runtime_env.onednn_state(), "cells": cells}


@error_boundary.guard()
def main(argv):
  del argv  # flags only (error_boundary refuses positional arguments)
  validate()
  if _ROLE.value == "cell":
    print(json.dumps(lib.run_cell(
        _MODELS.value[0], _CELL.value, _LAYOUTS.value[0], sizes(),
        steps=_STEPS.value, steps_per_execution=_STEPS_PER_EXECUTION.value,
        calls=_CALLS.value, autotune=_AUTOTUNE.value,
        e2e_aux_heads=_E2E_AUX.value,
        execution=ti.ExecutionOptions(loop=_LOOP.value,
                                      loop_block=_LOOP_BLOCK.value))))
    return
  report = main_report()
  print(lib.format_table(report))
  if _JSON_OUT.value:
    user_files.write_output(_JSON_OUT.value,
                            json.dumps(report, indent=1) + "\n", "--json_out")
  failed = [c for c in report["cells"] if "error" in c]
  if failed:
    first = failed[0]
    where = f" on {first['layout']}" if first["layout"] else ""
    print(f"error: {len(failed)} of {len(report['cells'])} cells failed, "
          f"first {first['model']} {first['strategy']}{where}: "
          f"{first['error']}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
