"""Every flag is refused or honoured exactly: bad values through the real
`train.train` binary, plus the sizes, schedules and splits behind them."""

import dataclasses
import os
import shutil
import subprocess
import sys

from absl import flags as absl_flags
import keras
import numpy as np
import pytest
import tensorflow as tf

from layers import common
from layers.interlock_module import InterlockModule
from tests.binaries import ROOT
from train.data import images
from train.data import text
from train import config as config_lib
from train import datasets
from train import networks
from train import optimization
from train import runtime_env

SYNTH = ["--preset=synthetic_mlp"]


def _text_corpus(path):
  """A small %-separated corpus: 400 documents of 36 lower-case words."""
  rng = np.random.default_rng(0)
  words = ("the quick brown fox jumps over a lazy dog and runs far away "
           "from home today").split()
  docs = [" ".join(rng.choice(words, 36)) for _ in range(400)]
  path.mkdir()
  (path / "corpus.txt").write_text("\n%\n".join(docs))
  return str(path)


def _idx_files(path, train=300, test=100):
  """Fashion-MNIST-shaped IDX files of random images."""
  path.mkdir()
  rng = np.random.default_rng(0)
  for stem, n in (("train", train), ("t10k", test)):
    (path / f"{stem}-labels-idx1-ubyte").write_bytes(
        np.array([0x801, n], ">u4").tobytes() +
        (np.arange(n) % 10).astype("u1").tobytes())
    (path / f"{stem}-images-idx3-ubyte").write_bytes(
        np.array([0x803, n, 28, 28], ">u4").tobytes() +
        rng.integers(0, 256, n * 784).astype("u1").tobytes())
  return str(path)


def _default_logging(flags):
  """Cases run under TF's default logging (no TF_CPP_MIN_LOG_LEVEL), whose
  stderr must be the error line alone: an unreachable --tpu (no gRPC
  retry lines)."""
  return "--placement=tpu" in flags


def _start(flags):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  if _default_logging(flags):
    del env["TF_CPP_MIN_LOG_LEVEL"]
  return subprocess.Popen([sys.executable, "-m", "train.train", *flags],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _cases(tmp_path, prepared):
  """(through the binary?, flags, words the one error line must hold).

  Every case is refused before anything is written. A case through the
  binary costs a process (seconds of CPU for TensorFlow's import), so one
  case goes through `python -m train.train`: the unreachable TPU, whose
  stderr under TF's default logging must be the error line alone, which
  only a fresh process shows. The others call the same `main`, behind the
  same error boundary, in this process.
  """
  a_file = tmp_path / "a_file"
  a_file.write_text("not a directory")
  corpus = _text_corpus(tmp_path / "corpus")
  lm = ["--preset=fortunes_lm", "--dataset=text_files",
          f"--source_dir={corpus}", f"--data_dir={tmp_path}/text_data",
          "--vocab_kind=char", "--vocab_size=40", "--placement=single",
          "--num_layers=2", "--num_modules=2", "--d_model=16",
          "--num_heads=2", "--mlp_dim=32", "--seq_len=16", "--batch_size=8"]
  truncated = _truncated_copy(prepared, tmp_path)
  return [
      (False, SYNTH + ["--split=1,1"], ["--split='1,1'", "4 positive counts"]),
      (False, SYNTH + ["--epochs=1", "--train_steps=10"],
       ["--epochs=1.0", "not both"]),
      (False, SYNTH + ["--epochs=0.0001"], ["--epochs=0.0001", "gives 0 steps"]),
      (False, SYNTH + ["--batch_size=2048"],
       ["--batch_size=2048", "evaluation split of synthetic holds 1024"]),
      (False, SYNTH + [f"--data_dir={a_file}"],
       [f"--data_dir='{a_file}'", "not a file"]),
      (True, SYNTH + ["--placement=tpu", "--tpu=nosuchtpu"],
       ["--tpu='nosuchtpu'", "cannot reach the TPU"]),
      (False, lm + ["--seq_len=50000"], ["--seq_len=50000", "training split"]),
      (False, ["--preset=fashion_mnist_resnet", "--placement=single",
              "--batch_size=50", f"--source_dir={prepared[0]}",
              f"--data_dir={truncated}"],
       ["fashion_mnist_local-train.tfrecord", "truncated"]),
      (False, SYNTH + ["--weight_decay=-1"], ["--weight_decay=-1.0", ">= 0"]),
      (False, SYNTH + ["--steps_per_loop=4", "--loop_block=5"],
       ["--loop_block=5", "<= 4"]),
      (False, SYNTH + ["--loop_block=-1"], ["--loop_block=-1", ">= 0"]),
      (False, SYNTH + ["--placement=cluster", "--loop_block=1"],
       ["--loop_block=1", "placement=cluster"]),
      (False, SYNTH + ["--learning_rate=inf"],
       ["--learning_rate=inf", "finite"]),
      (False, SYNTH + ["--learning_rate=nan"],
       ["--learning_rate=nan", "finite"]),
      (False, SYNTH + ["--momentum=-1"], ["--momentum=-1.0", ">= 0"]),
      (False, SYNTH + ["--seed=-1"], ["--seed=-1", ">= 0"]),
      (False, SYNTH + ["--batch_size=5000"],
       ["--batch_size=5000", "training split of synthetic holds 4096"]),
      (False, SYNTH + ["--warmup_steps=20"],
       ["--warmup_steps=20", "< train_steps"]),
      (False, SYNTH + ["--lr_schedule=cosine", "--train_steps=none",
                       "--time_budget_s=5"], ["--lr_schedule='cosine'",
                                              "budget"]),
      (False, SYNTH + ["--lr_decay_fractions=0.8,0.5"],
       ["--lr_decay_fractions='0.8,0.5'", "increasing"]),
      (False, SYNTH + ["--vocab_kind=bpe"], ["--vocab_kind='bpe'",
                                             "wordpiece"]),
      (False, SYNTH + [f"--data_dir={a_file}/tfds"],
       [f"--data_dir='{a_file}/tfds'", "which is a file"]),
      (False, SYNTH + [f"--source_dir={a_file}"],
       [f"--source_dir='{a_file}'", "not a file"]),
      (False, lm + ["--epochs=0.001"], ["--epochs=0.001", "gives 0 steps"]),
      # Each network with the other kind of example (issue 46: the ResNet
      # on synthetic vectors failed after validation, unpacking a shape).
      (False, SYNTH + ["--model=resnet"],
       ["--model='resnet'", "dataset=synthetic gives vectors",
        "needs an image dataset"]),
      (False, ["--preset=fashion_mnist_resnet", "--model=mlp",
               "--placement=single", f"--source_dir={prepared[0]}",
               f"--data_dir={prepared[1]}"],
       ["--model='mlp'", "gives images", "model=mlp takes vectors"]),
      (False, lm + ["--vocab_kind=wordpiece", "--vocab_size=4"],
       ["vocab_size=4", "too small"]),
  ]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  """(source_dir, data_dir): fake IDX files prepared by TFDS."""
  root = tmp_path_factory.mktemp("prepared")
  source_dir, data_dir = _idx_files(root / "idx"), str(root / "tfds")
  images.image_dataset("fashion_mnist", "test", 10, training=False,
                       data_dir=data_dir, source_dir=source_dir)
  return source_dir, data_dir


def _truncated_copy(prepared, tmp_path):
  """A copy of the prepared data whose train TFRecord lost 100 bytes."""
  data_dir = tmp_path / "tfds"
  shutil.copytree(prepared[1], data_dir)
  [record] = list(data_dir.rglob("*-train.tfrecord-*"))
  with open(record, "r+b") as f:
    f.truncate(record.stat().st_size - 100)
  return str(data_dir)


def _in_process(flags_given, capsys):
  """(exit code, stderr) of train.train's main, flags parsed as absl does."""
  from train import train  # pylint: disable=g-import-not-at-top
  absl_flags.FLAGS.unparse_flags()
  absl_flags.FLAGS(["train.train", *flags_given])
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_info:
    train.main(["train.train"])
  return exit_info.value.code, capsys.readouterr().err


def _check(flags_given, words, code, err, model_dir):
  assert code == 1, (flags_given, err)
  assert "Traceback" not in err, (flags_given, err)
  lines = [line for line in err.splitlines() if words[0] in line]
  assert len(lines) == 1, (flags_given, err)
  for word in words:
    assert word in lines[0], (flags_given, lines[0])
  assert not model_dir.exists(), flags_given


def _stop(procs):
  for proc in procs:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()


@pytest.fixture
def bad_flag_runs(tmp_path, prepared):
  """The bad-flag runs through the binary, started at once (in parallel).

  Returns:
    (cases, tmp_path, [(flags, words, model_dir, proc)]).
  """
  cases = _cases(tmp_path, prepared)
  bad = []
  for i, (binary, flags_given, words) in enumerate(cases):
    if binary:
      model_dir = tmp_path / f"run{i}"
      bad.append((flags_given, words, model_dir,
                  _start(flags_given + [f"--model_dir={model_dir}"])))
  yield cases, tmp_path, bad
  _stop([run[-1] for run in bad])


@pytest.fixture
def quiet_runs(tmp_path):
  """A 5-step run without and with --verbosity=0, started at once."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  env["PYTHONPATH"] = ROOT
  quiet = [subprocess.Popen(
      [sys.executable, "-m", "train.train", *SYNTH, "--train_steps=5",
       f"--model_dir={tmp_path / f'quiet{i}'}", *verbosity], cwd=ROOT,
      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i, verbosity in enumerate(([], ["--verbosity=0"]))]
  yield quiet
  _stop(quiet)


@pytest.mark.slow
def test_bad_flags_fail_in_one_line_and_write_nothing(bad_flag_runs, capsys):
  cases, tmp_path, bad = bad_flag_runs
  try:
    for i, (binary, flags_given, words) in enumerate(cases):
      if not binary:
        model_dir = tmp_path / f"run{i}"
        code, err = _in_process(flags_given + [f"--model_dir={model_dir}"],
                                capsys)
        _check(flags_given, words, code, err, model_dir)
  finally:
    absl_flags.FLAGS.unparse_flags()
  for flags_given, words, model_dir, proc in bad:
    _, err = proc.communicate(timeout=300)
    _check(flags_given, words, proc.returncode, err, model_dir)
    if _default_logging(flags_given):
      assert len(err.strip().splitlines()) == 1, (flags_given, err)


def _config(**fields):
  return dataclasses.replace(config_lib.load_preset("synthetic_mlp"),
                             **fields)


def test_total_steps_for_every_dataset_kind(tmp_path):
  # Synthetic: 4096 training examples.
  assert optimization.total_steps(
      _config(train_steps=None, epochs=1, batch_size=32)) == 128
  # Images: the training split of dataset_info.
  fashion = _config(model="resnet", dataset="fashion_mnist",
                    train_steps=None, epochs=2, batch_size=128)
  assert optimization.total_steps(fashion) == 2 * 60000 // 128
  # Text: packed sequences of seq_len + 1 tokens; a char vocabulary makes
  # every character one token, plus one EOS per document.
  corpus = _text_corpus(tmp_path / "corpus")
  config = _config(model="transformer", dataset="text_files",
                   source_dir=corpus, data_dir=str(tmp_path / "data"),
                   vocab_kind="char", vocab_size=40, seq_len=16,
                   train_steps=None, epochs=3, batch_size=8)
  docs, _ = datasets.split_sizes(config)
  train_docs = [d for d in text.read_documents(corpus)
                if not text.is_validation(d, 0.05)]
  tokens = sum(len(d) + 1 for d in train_docs)
  assert docs == tokens // 17
  assert optimization.total_steps(config) == 3 * docs // 8
  # Fewer than one step is refused, naming --epochs.
  with pytest.raises(ValueError, match=r"--epochs=1e-05 .*gives 0 steps"):
    optimization.total_steps(dataclasses.replace(config, epochs=1e-5))


@pytest.mark.parametrize("schedule", config_lib.SCHEDULES)
def test_warmup_applies_to_every_schedule(schedule):
  config = _config(learning_rate=0.4, lr_schedule=schedule, warmup_steps=10,
                   lr_decay_fractions=(0.5,), lr_decay_factor=0.1)
  lr = optimization.learning_rate(config, 110)
  at = lambda step: float(lr(step))
  assert at(0) == 0.0
  assert at(5) == pytest.approx(0.2)
  assert at(10) == pytest.approx(0.4)
  # After warmup each schedule runs over the remaining 100 steps.
  expected_late = {"constant": 0.4, "step": 0.04, "cosine": 0.0}[schedule]
  assert at(109.999) == pytest.approx(expected_late, abs=1e-3)
  if schedule == "step":
    assert at(59) == pytest.approx(0.4) and at(61) == pytest.approx(0.04)
  if schedule == "cosine":
    assert at(60) == pytest.approx(0.2, rel=1e-3)  # half-way: cos = 0
  # An optimizer with it round-trips through its config (as the op-cost
  # profiler clones it), giving the same rates.
  saved = keras.optimizers.SGD(lr).get_config()
  keras.optimizers.SGD.from_config(saved)
  clone = keras.optimizers.schedules.deserialize(saved["learning_rate"])
  assert type(clone) is optimization.Warmup
  for step in (0, 5, 30, 109):
    assert float(clone(step)) == pytest.approx(at(step))
  no_warmup = optimization.learning_rate(
      dataclasses.replace(config, warmup_steps=0), 110)
  assert float(no_warmup(0) if callable(no_warmup) else no_warmup) == (
      pytest.approx(0.4))


def test_split_modules_puts_layers_where_the_split_says():
  dense = lambda n: keras.layers.Dense(n)
  first, last = [dense(3)], [dense(2)]
  blocks = [dense(4) for _ in range(5)]
  heads = []

  def new_aux_head(k):
    heads.append(k)
    return dense(2)

  modules = common.split_modules(first, blocks, last, 3, split=[1, 3, 1],
                                 new_aux_head=new_aux_head, name="net")
  assert [m.name for m in modules] == ["net_module1", "net_module2",
                                       "net_module3"]
  assert [m.body.layers for m in modules] == [
      first + blocks[:1], blocks[1:4], blocks[4:] + last]
  assert heads == [1, 2] and modules[2].aux_head is None
  assert all(isinstance(m, InterlockModule) for m in modules)
  # Balanced by cost: one costly block gets a module of its own.
  by_cost = common.split_modules(
      first, blocks, last, 2, balance="main_flops",
      costs=lambda balance: ([1, 1, 1, 1, 10], None), name="net")
  assert [len(m.body.layers) for m in by_cost] == [1 + 4, 1 + 1]
  with pytest.raises(ValueError, match="balance"):
    common.split_modules(first, blocks, last, 2, balance="size", name="n")


def test_mlp_honours_split_as_hidden_layers_per_module():
  config = _config(split=(2, 1, 3, 1))
  task = datasets.Task("classification", 10, (32,), tf.float32, None, None)
  modules = networks.make_modules(config, task)
  hidden = [sum(1 for layer in m.body.layers if layer.units == 256)
            for m in modules]
  assert hidden == [2, 1, 3, 1]


def test_check_helpers_name_the_flag():
  with pytest.raises(ValueError, match=r"--steps=0 is invalid.*>= 1.*"
                     r"Received: steps=0$"):
    config_lib.check_positive("steps", 0, integer=True)
  with pytest.raises(ValueError, match=r"--budget_s=-1 .*> 0"):
    config_lib.check_positive("budget_s", -1)
  with pytest.raises(ValueError, match=r"--mode='x' .*\('a', 'b'\)"):
    config_lib.check_choice("mode", "x", ("a", "b"))
  with pytest.raises(ValueError, match=r"--p=1.5 .*<= 1"):
    config_lib.check_number("p", 1.5, minimum=0, maximum=1)
  config_lib.check_number("p", 1, minimum=0, maximum=1)
  config_lib.check_positive("n", None, allow_none=True)


def test_eval_split_of_every_image_dataset_exists():
  for name in config_lib.IMAGE_DATASETS:
    info = images.dataset_info(name)
    assert info.splits[info.eval_split] > 0
  assert images.dataset_info("imagenet2012").eval_split == "validation"


def _dataset_ops(ds):
  """Every op of a tf.data pipeline's graph."""
  variant = ds._variant_tensor  # pylint: disable=protected-access
  graph = tf.compat.v1.GraphDef()
  graph.ParseFromString(
      tf.raw_ops.DatasetToGraphV2(input_dataset=variant).numpy())
  return {node.op for node in graph.node} | {
      node.op for f in graph.library.function for node in f.node_def}


def test_image_pipelines_do_not_cache_a_partly_read_dataset(prepared):
  # TFDS would cache a small split; eval_batches (take) or a run that stops
  # mid-epoch then leaves the cache partly read, and TF warns.
  for training in (False, True):
    ds = images.image_dataset("fashion_mnist", "test", 10, training=training,
                              source_dir=prepared[0], data_dir=prepared[1])
    assert not any("Cache" in op for op in _dataset_ops(ds)), training


def test_verbosity_is_read_from_the_command_line():
  read = runtime_env.requested_verbosity
  assert read(["train"]) is None
  assert read(["train", "--verbosity=1", "--model_dir=x"]) == 1
  assert read(["train", "-v", "0"]) == 0
  assert read(["train", "--v=-1"]) == -1
  assert read(["train", "--verbosity", "2", "--verbosity=-2"]) == -2
  assert runtime_env.is_verbose(["train", "--verbosity=0"])
  assert not runtime_env.is_verbose(["train", "--verbosity=-1"])
  assert runtime_env.environment_defaults(False)["TF_CPP_MIN_LOG_LEVEL"] == "2"
  assert "TF_CPP_MIN_LOG_LEVEL" not in runtime_env.environment_defaults(True)


@pytest.mark.slow  # two train binaries, 13 s of make test's time
def test_a_run_is_quiet_unless_verbosity_asks(quiet_runs):
  (quiet_out, quiet), (_, verbose) = [p.communicate(timeout=300)
                                      for p in quiet_runs]
  assert [p.returncode for p in quiet_runs] == [0, 0], (quiet, verbose)
  assert "step 5/5" in quiet_out
  # absl INFO (checkpoint sharding) and what TF's C++ prints at import.
  for noise in ("Sharding callback", "before absl::InitializeLog()"):
    assert noise not in quiet, quiet
    assert noise in verbose, noise


@pytest.mark.parametrize("placement,fields", [
    ("cluster", {"cluster": "127.0.0.1:2222,127.0.0.1:2223",
                 "modules_per_worker": 2}),
    ("simulated", {"threads_per_device": 2, "modules_per_device": 2}),
])
def test_a_run_restores_on_one_device_whatever_placement_trained_it(
    placement, fields):
  # Export, evaluate and feature_stats rebuild a run on one device: its
  # placement-only fields must not make the recorded config invalid there.
  trained = dataclasses.replace(config_lib.Config(), num_modules=4,
                                placement=placement, **fields)
  config_lib.validate(trained)
  with pytest.raises(ValueError, match="applies only to placement"):
    config_lib.validate(dataclasses.replace(trained, placement="single"))
  restored = config_lib.on_one_device(trained)
  config_lib.validate(restored)
  assert restored.devices.placement == "single"
  assert dataclasses.replace(restored, placement=placement, **fields) == (
      trained)
