"""The binaries end to end on generated data: train, stop, resume, export,
evaluate, and the TensorBoard event files they leave behind."""

import glob
import json
import os
import shutil

import tensorflow as tf

from tests.binaries import run_binary, run_main


def scalars(event_dir):
  """{tag: {step: value}} read back from real TensorBoard event files."""
  found = {}
  for path in glob.glob(os.path.join(event_dir, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        number = float(tf.make_ndarray(value.tensor))
        found.setdefault(value.tag, {})[event.step] = number
  return found


def test_train_resume_export_evaluate(synthetic_run, tmp_path, capfd):
  # The first run, `--train_steps=10` with the flags of `common`, is
  # conftest.py's synthetic_run (trained once per process), copied: the
  # real train.train process. The resume and the second evaluation run
  # through their binaries' main in this process; train.export and the
  # first evaluation are real processes (a process start each is seconds).
  model_dir = str(tmp_path / "run")
  shutil.copytree(synthetic_run, model_dir)
  common = ["--preset=synthetic_mlp", f"--model_dir={model_dir}",
            "--steps_per_loop=5", "--checkpoint_every_steps=10",
            "--eval_every_steps=10"]
  with open(synthetic_run + ".stdout", encoding="utf-8") as f:
    assert "step 10/10" in f.read()
  # The export was moved into place: no temporary sibling is left.
  assert sorted(os.listdir(model_dir)) == [
      "checkpoints", "config.json", "eval", "export", "run.json", "train"]
  code, second, err = run_main("train.train", [*common, "--train_steps=20"],
                               capfd)
  assert code == 0, err
  assert "resumed from" in second and "at step 10" in second
  assert "step 15/20" in second and "step 5/20" not in second
  summary = json.loads(second.strip().splitlines()[-1])
  assert summary["step"] == 20
  # Heads are named as the training metrics: module_4 is the network.
  assert summary["eval"]["module_4"]["accuracy"] > 0.5  # 10 classes: 0.1
  with open(os.path.join(model_dir, "config.json")) as f:
    assert json.load(f)["train_steps"] == 20

  train_events = scalars(os.path.join(model_dir, "train"))
  for k in (1, 2, 3, 4):
    assert set(train_events[f"module_{k}/loss"]) == {5, 10, 15, 20}
    assert f"module_{k}/learning_rate" in train_events
  assert "examples_per_s" in train_events and "step_time_s" in train_events
  eval_events = scalars(os.path.join(model_dir, "eval"))
  assert set(eval_events["module_4/accuracy"]) == {10, 20}
  assert "module_1/accuracy" in eval_events and "module_3/loss" in eval_events

  export_dir = str(tmp_path / "exported")
  run_binary("train.export", f"--model_dir={model_dir}",
             f"--export_dir={export_dir}")
  # The run's configuration comes from config.json or the export's marker:
  # no --preset.
  evaluated = run_binary("train.evaluate", f"--saved_model={export_dir}")
  code, in_process, err = run_main("train.evaluate",
                                   [f"--model_dir={model_dir}"], capfd)
  assert code == 0, err
  for stdout in (evaluated.stdout, in_process):
    result = json.loads(stdout.strip().splitlines()[-1])
    assert set(result) == {"module_1", "module_2", "module_3", "module_4"}
    for head, metrics in result.items():
      assert abs(metrics["accuracy"] - summary["eval"][head]["accuracy"]) < (
          1e-6)
      assert metrics["num_examples"] == 64  # eval_batches=2 of 32


def test_an_lm_at_unigram_perplexity_is_named():
  from train import train_lib  # pylint: disable=g-import-not-at-top
  learnt = {"module_2": {"perplexity": 155.0},
            "module_1": {"perplexity": 175.0}}
  assert train_lib.no_context_warning(learnt, 447.7) is None
  # The collapsed 2-wise "only" runs of the fortunes study: every head near
  # the unigram perplexity (exit 1 above it).
  collapsed = {"module_10": {"perplexity": 448.8},
               "module_1": {"perplexity": 450.1},
               "module_2": {"perplexity": 300.0}}
  warning = train_lib.no_context_warning(collapsed, 447.7)
  assert "module_1 450.1, module_10 448.8" in warning  # in depth order
  assert "module_2" not in warning and "447.7" in warning
  # Classification runs have no perplexity: nothing to say.
  assert train_lib.no_context_warning({"module_3": {"accuracy": 0.1}},
                                      10.0) is None
