"""Cluster hangs with real processes on 127.0.0.1: an impostor on a
worker's port and a frozen (SIGSTOPped) worker are named in one line within
--cluster_timeout_s, and SIGTERM stops the client within 5 s while it
connects or waits on a frozen worker.

The impostors: a listening socket of this test that never accepts (the
kernel completes the TCP handshake; nothing answers) and Python's HTTP
server. Every process is stopped by the `procs` fixture, also on failure.
"""

import os
import select
import signal
import socket
import time

import pytest
import tensorflow as tf

from tests import cluster_procs
from tests.binaries import stop_and_time

pytestmark = pytest.mark.cluster
RUN = ["--preset=synthetic_mlp", "--num_modules=2",
       "--checkpoint_every_steps=20", "--steps_per_loop=10",
       "--eval_every_steps=100000"]


@pytest.fixture
def silent_listener():
  """A port that accepts TCP connections and never answers."""
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  sock.listen(64)
  yield sock
  sock.close()


def _address(sock):
  return f"127.0.0.1:{sock.getsockname()[1]}"


def _http_server(procs):
  port = cluster_procs.free_ports(1)[0]
  procs.start("http.server", str(port), "--bind", "127.0.0.1")
  address = f"127.0.0.1:{port}"
  deadline = time.monotonic() + 60
  while True:
    try:
      socket.create_connection(("127.0.0.1", port), timeout=1).close()
      return address
    except OSError:
      assert time.monotonic() < deadline, "http.server did not start"
      time.sleep(0.1)


def _with_impostor(procs, impostor):
  """A real worker 0 and the impostor as worker 1: the --cluster flag."""
  port0 = cluster_procs.free_ports(1)[0]
  cluster = f"127.0.0.1:{port0},{impostor}"
  procs.start_worker(cluster, 0)
  return cluster


@pytest.mark.parametrize("kind", ["silent", "http"])
def test_impostor_on_a_worker_port_is_named_within_the_timeout(
    procs, tmp_path, silent_listener, kind):
  impostor = (_address(silent_listener) if kind == "silent" else
              _http_server(procs))
  cluster = _with_impostor(procs, impostor)
  model_dir = str(tmp_path / "run")
  started = time.monotonic()
  client = procs.start("train.train", *RUN, "--train_steps=20",
                       "--placement=cluster", f"--cluster={cluster}",
                       "--cluster_timeout_s=10", f"--model_dir={model_dir}")
  client.wait(timeout=120)
  seconds = time.monotonic() - started
  errors = client.stderr.read().strip().splitlines()
  assert client.returncode == 1, errors
  assert len(errors) == 1 and errors[0].startswith(
      "error: not a TF worker after 10 s: task 1 "
      f"({impostor}) accepts connections but "), errors
  assert ("does not answer" if kind == "silent" else "speaks no gRPC") in (
      errors[0])
  assert errors[0].endswith(f"Received: cluster={cluster}")
  assert seconds < 90, seconds  # the 10 s, plus the client's start-up


def test_sigterm_while_connecting_to_an_impostor(procs, tmp_path,
                                                 silent_listener):
  cluster = _with_impostor(procs, _address(silent_listener))
  model_dir = str(tmp_path / "run")
  client = procs.start("train.train", *RUN, "--train_steps=20",
                       "--placement=cluster", f"--cluster={cluster}",
                       "--cluster_timeout_s=600", f"--model_dir={model_dir}")
  # The client's handshake has connected once a connection waits to be
  # accepted (it never is): the client is connecting, for up to 600 s.
  readable, _, _ = select.select([silent_listener], [], [], 300)
  assert readable and client.poll() is None, client.stderr.read()
  seconds, errors = stop_and_time(client, signal.SIGTERM)
  assert seconds < 5.0, seconds
  assert len(errors) == 1 and "stopped (SIGTERM)" in errors[0], errors
  assert not os.path.exists(os.path.join(model_dir, "checkpoints"))


def _frozen_run(procs, tmp_path):
  """A cluster run past its first checkpoint whose worker 1 is stopped."""
  cluster, workers = procs.start_cluster(2)
  model_dir = str(tmp_path / "run")
  client = procs.start("train.train", *RUN, "--train_steps=1000000",
                       "--placement=cluster", f"--cluster={cluster}",
                       "--cluster_timeout_s=10", f"--model_dir={model_dir}")
  for line in client.stdout:
    if line.startswith("step 40/"):
      break
  else:
    pytest.fail(client.stderr.read()[-2000:])
  workers[1].send_signal(signal.SIGSTOP)
  return cluster, workers, client, model_dir


def _latest(model_dir):
  return tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))


def test_frozen_worker_is_named_within_the_cluster_timeout(procs, tmp_path):
  cluster, workers, client, model_dir = _frozen_run(procs, tmp_path)
  frozen_at = time.monotonic()
  try:
    client.wait(timeout=120)
    waited = time.monotonic() - frozen_at
  finally:
    workers[1].send_signal(signal.SIGCONT)
  errors = [line for line in client.stderr.read().splitlines()
            if line.startswith("error:")]
  address = cluster.split(",")[1]
  assert len(errors) == 1 and errors[0].startswith(
      f"error: worker task 1 ({address}) has not answered for "), errors
  assert f"kept: the last complete checkpoint {_latest(model_dir)}" in (
      errors[0]), errors
  # Named after 10 s of silence, probed every 2.5 s (each probe <= 2 s).
  assert 10 <= waited < 30, waited


def test_sigterm_while_a_worker_is_frozen(procs, tmp_path):
  _, workers, client, model_dir = _frozen_run(procs, tmp_path)
  try:
    seconds, errors = stop_and_time(client, signal.SIGTERM)
  finally:
    workers[1].send_signal(signal.SIGCONT)
  assert seconds < 5.0, seconds
  assert len(errors) == 1, errors
  latest = _latest(model_dir)
  assert latest and latest in errors[0], (latest, errors)
  assert "stopped (SIGTERM)" in errors[0] or "SIGTERM at step" in errors[0]
