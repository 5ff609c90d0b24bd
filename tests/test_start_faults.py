"""No hang, no abort, no traceback at start: one worker named twice,
workers listed in another order, bad TF/OpenMP environment variables, an
empty or too-big data set, a wait that must keep its timeout, and a stop
watchdog that was killed.
"""

import ast
import os
import resource
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import cluster_procs
from tests import procfs
from tests.binaries import ROOT, run_main
from tf_interlock import cluster as cluster_lib
from tf_interlock import cluster_wait
from train import runtime_env
from train import stop_watchdog

# Binaries started against hostile starts (workers, data, environment):
# make test-slow (and CI) runs them.
pytestmark = pytest.mark.slow


def _errors(err):
  return [line for line in err.splitlines() if line.startswith("error:")]


def test_one_worker_in_two_spellings_is_refused_up_front(tmp_path, capfd):
  cluster = "127.0.0.1:2345,localhost:2345"
  code, out, err = run_main("train.train", [
      "--preset=synthetic_mlp", "--num_modules=2", "--placement=cluster",
      f"--cluster={cluster}", "--cluster_timeout_s=20",
      f"--model_dir={tmp_path}/run"], capfd)
  assert code == 1 and not out and _errors(err) == [
      f"error: --cluster={cluster!r} is invalid: cluster names one worker "
      "twice: 127.0.0.1:2345 and "
      "localhost:2345 are the same host and port; each worker needs its own "
      f"host:port. Received: cluster={cluster!r}"], err
  assert os.listdir(tmp_path) == []
  for same in ("[::1]:7,127.0.0.1:7", "H0:7,h0:7", "127.0.0.1:7,127.0.0.1:7"):
    with pytest.raises(ValueError, match="twice"):
      cluster_lib.parse_addresses(same)
  assert cluster_lib.parse_addresses("127.0.0.1:7,localhost:8") == [
      "127.0.0.1:7", "localhost:8"]


def test_a_worker_answering_as_another_task_is_named():
  """GetStatus answers carry the worker's own device names: the task it
  was started as (here: one worker reached under both addresses)."""
  status = b"\n3\n'/job:worker/replica:0/task:0/device:CPU:0\x12\x03CPU"
  with pytest.raises(ConnectionError) as e:
    cluster_wait.check_identities(["127.0.0.1:5", "localhost:5"],
                                 {0: status, 1: status})
  assert str(e.value) == (
      "the cluster lists localhost:5 as task 1, but the same worker as task "
      "0 (127.0.0.1:5) answers there; list each worker once, in the order of "
      "the workers' own --cluster and --task. Received: "
      "cluster=127.0.0.1:5,localhost:5")
  other = status.replace(b"task:0", b"task:1")
  with pytest.raises(ConnectionError, match="a worker started as --task=1"):
    cluster_wait.check_identities(["a:1", "b:1"], {0: other, 1: status})
  cluster_wait.check_identities(["a:1", "b:1"], {0: status, 1: other})


@pytest.mark.cluster
def test_workers_in_swapped_order_are_refused_within_the_timeout(
    procs, tmp_path, capfd):
  cluster, _ = procs.start_cluster(2)
  swapped = ",".join(reversed(cluster.split(",")))
  started = time.monotonic()
  code, _, err = run_main("train.train", [
      "--preset=synthetic_mlp", "--num_modules=2", "--placement=cluster",
      f"--cluster={swapped}", "--cluster_timeout_s=20",
      f"--model_dir={tmp_path}/run"], capfd)
  assert time.monotonic() - started < 60
  assert code == 1 and _errors(err) == [
      f"error: the cluster lists {swapped.split(',')[0]} as task 0, but a "
      f"worker started as --task=1 answers there; list each worker once, in "
      f"the order of the workers' own --cluster and --task. Received: "
      f"cluster={swapped}"], err
  assert not os.path.exists(tmp_path / "run")


def _child(code, **environ):
  return subprocess.Popen(
      [sys.executable, "-c", code], cwd=ROOT,
      env=dict(cluster_procs.env(), **environ), stdin=subprocess.PIPE,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_bounded_wait_is_stopped_at_its_timeout():
  """A wait inside TF that cannot keep its timeout (here: a sleep) is
  stopped by the watchdog once `bounded`'s seconds are up."""
  proc = _child("from train import stop_watchdog\n"
                "stop_watchdog.start('nothing was written')\n"
                "import time\n"
                "with stop_watchdog.bounded(1.0, 'connecting to the test'):\n"
                "  time.sleep(120)\n")
  started = time.monotonic()
  _, err = proc.communicate(timeout=120)
  assert time.monotonic() - started < 60
  assert proc.returncode == -signal.SIGKILL
  assert _errors(err) == [
      "error: connecting to the test did not finish within 1 s, so the "
      "binary was stopped; nothing was written"], err


def test_a_killed_watchdog_is_named_and_replaced():
  proc = _child(
      "import os, signal, sys\n"
      "from train import stop_watchdog\n"
      "stop_watchdog.start('x')\n"
      "first = stop_watchdog._Child.proc\n"  # pylint: disable=protected-access
      "os.kill(first.pid, signal.SIGKILL); first.wait()\n"
      "stop_watchdog.Watch().after_loop(None)\n"
      "print(first.pid, stop_watchdog._Child.proc.pid, flush=True)\n"
      "sys.stdin.readline()\n")
  try:
    first, second = map(int, proc.stdout.readline().split())
    assert procfs.children(proc.pid) == [second]
    lines = [proc.stderr.readline().strip()]
    assert lines == [
        f"warning: the stop watchdog (pid {first}) was killed by SIGKILL; "
        f"started a new one (pid {second}), so a signal during a long "
        f"TensorFlow call is still acted on within "
        f"{stop_watchdog.DEFAULT_GRACE_S:g} s"], lines
  finally:
    proc.kill()
    proc.communicate()


@pytest.mark.parametrize("name,value", [
    ("TF_NUM_INTRAOP_THREADS", "-5"), ("TF_NUM_INTEROP_THREADS", "abc"),
    ("OMP_NUM_THREADS", "-1"), ("OMP_NUM_THREADS", "4,0"),
    ("TF_CPP_MIN_LOG_LEVEL", "loud"), ("TF_ENABLE_ONEDNN_OPTS", "maybe"),
    ("TF_OVERRIDE_GLOBAL_THREADPOOL", "x"), ("TF_DETERMINISTIC_OPS", "2"),
    ("TF_INTERLOCK_STOP_GRACE_S", "soon")])
def test_a_bad_start_up_variable_is_named(name, value):
  assert runtime_env.environment_problem({name: value}) == (
      f"{name}={value!r} in the environment is not "
      f"{runtime_env.ENVIRONMENT[name][1]}; it is read as the process "
      f"starts, before any flag: unset it or fix it. Received: "
      f"{name}={value!r}")
  fine = {"TF_NUM_INTRAOP_THREADS": "0", "OMP_NUM_THREADS": "4,2",
          "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "True",
          "TF_INTERLOCK_STOP_GRACE_S": "1.5", name: ""}
  assert runtime_env.environment_problem(fine) is None


def test_tf_num_intraop_threads_is_one_line_not_an_abort(tmp_path):
  """TF aborted with a stack dump: the binary names it before TF loads."""
  proc = subprocess.run(
      [sys.executable, "-m", "train.train", "--preset=synthetic_mlp",
       f"--model_dir={tmp_path}/run"], cwd=ROOT, capture_output=True,
      text=True, timeout=300, env=dict(cluster_procs.env(),
                                       TF_NUM_INTRAOP_THREADS="-5"))
  assert proc.returncode == 1 and proc.stderr.splitlines() == [
      "error: " + runtime_env.environment_problem(
          {"TF_NUM_INTRAOP_THREADS": "-5"})], proc.stderr
  assert not os.path.exists(tmp_path / "run")


def test_every_binary_checks_the_environment_before_tensorflow():
  """runtime_env (which checks it) is every binary's first import of ours."""
  for folder in ("train", "research"):
    for name in sorted(os.listdir(os.path.join(ROOT, folder))):
      path = os.path.join(ROOT, folder, name)
      if not name.endswith(".py") or name == "error_boundary.py":
        continue  # error_boundary: the binaries' boundary, not a binary
      with open(path, encoding="utf-8") as f:
        source = f.read()
      if "app.run(main)" not in source:
        continue
      first = next(
          n for n in ast.parse(source).body
          if isinstance(n, (ast.Import, ast.ImportFrom)) and _ours(n))
      assert isinstance(first, ast.ImportFrom) and first.module == "train" and [
          a.name for a in first.names] == ["runtime_env"], path


def _ours(node):
  """Whether an import statement loads our packages or TensorFlow."""
  names = ([a.name for a in node.names] if isinstance(node, ast.Import)
           else [node.module or ""])
  return any(n.split(".")[0] in ("train", "research", "tf_interlock", "layers",
                                 "step_model", "tensorflow", "keras")
             for n in names)


def _idx(folder, train, test=40):
  folder.mkdir()
  rng = np.random.default_rng(0)
  for stem, n in (("train", train), ("t10k", test)):
    (folder / f"{stem}-labels-idx1-ubyte").write_bytes(
        np.array([0x801, n], ">u4").tobytes() +
        (np.arange(n) % 10).astype("u1").tobytes())
    (folder / f"{stem}-images-idx3-ubyte").write_bytes(
        np.array([0x803, n, 28, 28], ">u4").tobytes() +
        rng.integers(0, 256, n * 784).astype("u1").tobytes())
  return str(folder)


FASHION = ["--preset=fashion_mnist_resnet", "--train_steps=2",
           "--warmup_steps=0", "--num_modules=2", "--batch_size=8"]


def test_an_idx_file_of_0_images_is_one_line_naming_it(tmp_path, capfd):
  source = _idx(tmp_path / "idx", train=0)
  code, _, err = run_main("train.train", FASHION + [
      f"--source_dir={source}", f"--data_dir={tmp_path}/data",
      f"--model_dir={tmp_path}/run"], capfd)
  path = os.path.join(source, "train-images-idx3-ubyte")
  assert code == 1 and "Traceback" not in err and _errors(err) == [
      f"error: {path} holds 0 images; the train split needs at least one. "
      f"Received: path={path}"], err
  assert not os.path.exists(tmp_path / "run")


def _limit_file_size():
  """In the child: files may not grow past 256 kB (EFBIG, like ENOSPC a
  failed write); SIGXFSZ ignored so the write fails instead of killing."""
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))


def test_a_data_dir_without_room_is_one_line_and_keeps_nothing(tmp_path):
  """3000 images (2.4 MB prepared) where no file may pass 256 kB: one line
  naming the folder, no prepared version a rerun would trust, and the
  rerun with room prepares and trains."""
  source = _idx(tmp_path / "idx", train=3000)
  flags = FASHION + [f"--source_dir={source}", f"--data_dir={tmp_path}/data",
                     f"--model_dir={tmp_path}/run"]
  proc = subprocess.run(
      [sys.executable, "-m", "train.train", *flags], cwd=ROOT,
      env=cluster_procs.env(), capture_output=True, text=True, timeout=600,
      preexec_fn=_limit_file_size)
  errors = _errors(proc.stderr)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
  assert len(errors) == 1 and errors[0].startswith(
      "error: Could not prepare fashion_mnist_local in "
      f"{tmp_path}/data: ") and "nothing half-prepared is left" in errors[0]
  left = [os.path.join(top, n) for top, dirs, files in os.walk(
      tmp_path / "data") for n in dirs + files]
  assert not [p for p in left if "incomplete" in p or p.endswith(
      (".tfrecord-00000-of-00001", "dataset_info.json"))], left
  rerun = subprocess.run([sys.executable, "-m", "train.train", *flags],
                         cwd=ROOT, env=cluster_procs.env(),
                         capture_output=True, text=True, timeout=600)
  assert rerun.returncode == 0, rerun.stderr


def test_an_atomic_write_that_fails_leaves_no_temporary_file(tmp_path):
  code = ("import sys\nfrom train import paths\n"
          "try:\n  paths.write_atomic(sys.argv[1], 'x' * 500000)\n"
          "except Exception as e:\n  print(type(e).__name__)\n")
  proc = subprocess.run(
      [sys.executable, "-c", code, str(tmp_path / "f.json")], cwd=ROOT,
      env=cluster_procs.env(), capture_output=True, text=True, timeout=300,
      preexec_fn=_limit_file_size)
  assert proc.stdout.strip(), proc.stderr  # the write failed
  assert os.listdir(tmp_path) == []
