"""The hostile sweep's signal, cluster, TF_CONFIG and API-misuse cases.

Signals land in a known phase: the binary runs through `tests.hold`, which
holds it just after the n-th call of a function returned (the lock taken,
the model built, a loop of steps, a checkpoint's files written but not yet
recorded, an evaluation, an export's temporary folder); the sweep acts
only then. Start-up and tracing have no such point and use fixed delays.
"""

import os
import signal
import socket
import subprocess
import sys

from tools.hostile_cases import (CLUSTER, Case, INT, KILL, LONG, RESUME, STOP,
                                 TERM, TT, _then, _trained)

# Live cluster workers of a case, by its folder (for ("worker", i, sig)).
PEERS = {}

HOLDS = {  # phase: (target, n) with RESUME's flags
    "lock": ("train.run_lock.RunLock.acquire", 1),
    "build": ("train.train_lib.build", 1),
    "training": ("train.actions.Progress.after_loop", 3),
    "saving": ("tensorflow.python.checkpoint.checkpoint.Checkpoint._write", 2),
    "evaluating": ("train.train_lib.evaluate", 1),
    "exporting": ("tf_interlock.export._stop_gradients_to_identities", 1),
}


def _free_ports(count):
  socks = [socket.socket() for _ in range(count)]
  for s in socks:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in socks]
  for s in socks:
    s.close()
  return ports


def _workers(work):
  """Starts 2 train.worker processes on 127.0.0.1; WORK/.cluster names
  them (the runner puts it for PEERS)."""
  ports = _free_ports(2)
  cluster = ",".join(f"127.0.0.1:{p}" for p in ports)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  procs = [subprocess.Popen(
      [sys.executable, "-m", "train.worker", f"--cluster={cluster}",
       f"--task={i}"], env=env, stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
           for i in range(2)]
  PEERS[work] = procs
  with open(os.path.join(work, ".cluster"), "w", encoding="utf-8") as f:
    f.write(cluster)

  def stop():
    for proc in procs:
      if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)  # a stopped one cannot die
        proc.kill()
      proc.wait()
  return stop


def _http_impostor(work):
  port = _free_ports(1)[0]
  proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port),
                           "--bind", "127.0.0.1"], cwd=work,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  with open(os.path.join(work, ".cluster"), "w", encoding="utf-8") as f:
    f.write(f"IMPOSTOR0,127.0.0.1:{port}")
  return lambda: (proc.kill(), proc.wait())


def signal_cases():
  found = []
  resume = {"resume": RESUME, "reference": True}
  for phase, hold in HOLDS.items():
    for signum in (TERM, INT, KILL):
      found.append(Case(
          f"train {signum.name} while {phase}, then resume", "train.train",
          RESUME, expect="killed" if signum == KILL else "stop", hold=hold,
          act=(("sig", signum),), **resume))
  for delay in (0.3, 1.5):
    for signum in (TERM, INT, KILL):
      found.append(Case(
          f"train {signum.name} at {delay} s (starting), then resume",
          "train.train", RESUME, signal_after=delay, act=(("sig", signum),),
          expect="killed" if signum == KILL else "stop", **resume))
  for delay in (5, 12):
    for signum in (TERM, INT):
      found.append(Case(
          f"train M=32 (tracing) {signum.name} at {delay} s", "train.train",
          TT + ["--num_microbatches=32", "--model_dir=WORK/run"],
          expect="stop", signal_after=delay, act=(("sig", signum),)))
  found.append(Case("train SIGTERM at 20 s (long run)", "train.train",
                    LONG + ["--model_dir=WORK/run"], expect="stop",
                    signal_after=20))
  export = ("train.export", ["--model_dir=WORK/run"])
  for signum in (TERM, INT, KILL):
    found.append(Case(
        f"train.export {signum.name} while exporting, then export again",
        "train.export", export[1], setup=_trained,
        expect="killed" if signum == KILL else "stop",
        hold=HOLDS["exporting"], act=(("sig", signum),), resume=export))
  for delay in (2, 8):
    found.append(Case(f"train.evaluate SIGTERM at {delay} s", "train.evaluate",
                      ["--model_dir=WORK/run"], setup=_trained,
                      expect="stop", signal_after=delay, keep="WORK/run"))
  compare = ["--preset=synthetic_mlp", "--out_dir=WORK/c",
             "--train_steps=100000", "--strategies=e2e", "--noplots",
             "--cost_repeats=1"]
  for signum, delay in ((TERM, 5), (TERM, 25), (INT, 25), (KILL, 25)):
    found.append(Case(f"research.compare {signum.name} at {delay} s",
                      "research.compare", compare, signal_after=delay,
                      act=(("sig", signum),),
                      expect="killed" if signum == KILL else "stop"))
  for signum, delay in ((TERM, 5), (TERM, 20), (INT, 20)):
    found.append(Case(f"research.benchmark {signum.name} at {delay} s",
                      "research.benchmark", ["--json_out=WORK/b.json"],
                      signal_after=delay, act=(("sig", signum),),
                      expect="stop", absent="WORK/b.json"))
  port = _free_ports(1)[0]
  for signum in (TERM, INT):
    found.append(Case(f"train.worker {signum.name} at 10 s", "train.worker",
                      [f"--cluster=127.0.0.1:{port}", "--task=0"],
                      expect="stop", signal_after=10, act=(("sig", signum),)))
  return found


def cluster_cases():
  timeout = ["--cluster_timeout_s=120", "--model_dir=WORK/run"]
  found = [
      Case("cluster impostor workers (timeout 5 s)", "train.train",
           CLUSTER + ["--cluster=IMPOSTOR0,IMPOSTOR1",
                      "--cluster_timeout_s=5", "--model_dir=WORK/run"]),
      Case("cluster http.server on worker 1 (timeout 10 s)", "train.train",
           CLUSTER + ["--cluster=PEERS", "--cluster_timeout_s=10",
                      "--model_dir=WORK/run"], setup=_http_impostor),
      Case("cluster no worker (timeout 5 s)", "train.train",
           CLUSTER + ["--cluster=127.0.0.1:1,127.0.0.1:2",
                      "--cluster_timeout_s=5", "--model_dir=WORK/run"]),
      Case("cluster ok (2 real workers)", "train.train",
           CLUSTER + ["--cluster=PEERS"] + timeout, setup=_workers,
           expect="ok"),
      Case("cluster worker 1 frozen (SIGSTOP) at step 20", "train.train",
           CLUSTER[:1] + ["--train_steps=100000", "--steps_per_loop=10",
                          "--checkpoint_every_steps=10", "--num_modules=2",
                          "--placement=cluster", "--cluster=PEERS",
                          "--cluster_timeout_s=10", "--model_dir=WORK/run"],
           setup=_workers, hold=HOLDS["training"][:1] + (2,),
           act=(("worker", 1, STOP), ("go",)), expect="stop", stop_within=60),
      Case("cluster worker 1 killed at step 20", "train.train",
           CLUSTER[:1] + ["--train_steps=100000", "--steps_per_loop=10",
                          "--checkpoint_every_steps=10", "--num_modules=2",
                          "--placement=cluster", "--cluster=PEERS",
                          "--cluster_timeout_s=10", "--model_dir=WORK/run"],
           setup=_workers, hold=HOLDS["training"][:1] + (2,),
           act=(("worker", 1, KILL), ("go",)), expect="stop", stop_within=60),
  ]
  for signum in (TERM, INT):
    found.append(Case(f"cluster impostor {signum.name} while connecting",
                      "train.train", CLUSTER + [
                          "--cluster=IMPOSTOR0,IMPOSTOR1",
                          "--cluster_timeout_s=600", "--model_dir=WORK/run"],
                      expect="stop", signal_after=15, act=(("sig", signum),)))
  for signum in (TERM, KILL):
    found.append(Case(
        f"cluster client {signum.name} while training, then resume",
        "train.train", CLUSTER[:1] + [
            "--train_steps=40", "--steps_per_loop=10",
            "--checkpoint_every_steps=10", "--num_modules=2",
            "--placement=cluster", "--cluster=PEERS"] + timeout,
        setup=_workers, hold=HOLDS["training"][:1] + (2,),
        act=(("sig", signum),), expect="killed" if signum == KILL else "stop",
        resume=CLUSTER[:1] + ["--train_steps=40", "--steps_per_loop=10",
                              "--checkpoint_every_steps=10",
                              "--num_modules=2", "--placement=cluster",
                              "--cluster=PEERS"] + timeout))
  for text in ("[1,2]", '"str"', '{"task": 5}', "{not json", "", "null",
               '{"task": {"type": "worker", "index": -1}}',
               '{"cluster": {"worker": "h:1"}}',
               '{"cluster": {"worker": [1, 2]}, "task": {"type": "worker"}}',
               '{"cluster": {"worker": ["127.0.0.1:1"]}, '
               '"task": {"type": "worker", "index": 5}}',
               '{"cluster": {"worker": ["nohost"]}, '
               '"task": {"type": "worker", "index": 0}}',
               '{"cluster": {"ps": ["127.0.0.1:1"]}, '
               '"task": {"type": "ps", "index": 0}}'):
    found.append(Case(f"train TF_CONFIG={text!r}", "train.train",
                      TT + ["--model_dir=WORK/run"], env={"TF_CONFIG": text},
                      absent=None if text == "" else "WORK/run",
                      expect="either" if text == "" else "refuse"))
  found.append(Case("train.worker TF_CONFIG=[1,2]", "train.worker", [],
                    env={"TF_CONFIG": "[1,2]"}))
  return found


API_HEAD = r"""
import sys, numpy as np, keras, tf_interlock as ti
def mlp():
  i = keras.Input((8,))
  h = keras.layers.Dense(16, activation="relu")(i)
  h = keras.layers.Dense(16, activation="relu")(h)
  h = keras.layers.Dense(16, activation="relu")(h)
  return keras.Model(i, keras.layers.Dense(3)(h))
def compiled(**kw):
  m = ti.InterlockModel(ti.from_keras(mlp(), num_modules=2), **kw)
  m.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  return m
X = np.random.rand(64, 8).astype("float32")
Y = np.random.randint(0, 3, 64)
try:
"""
API_TAIL = r"""
except Exception as e:
  print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
  sys.exit(1)
"""
API = [  # (name, body, whether it must succeed)
    ("from_keras on an Input-only model",
     "i = keras.Input((8,)); ti.from_keras(keras.Model(i, i), num_modules=2)",
     False),
    ("from_keras num_modules='2'", "ti.from_keras(mlp(), num_modules='2')",
     False),
    ("from_keras num_modules=0", "ti.from_keras(mlp(), num_modules=0)", False),
    ("from_keras num_modules=99", "ti.from_keras(mlp(), num_modules=99)",
     False),
    ("InterlockModel strategy='bogus'",
     "ti.InterlockModel(ti.from_keras(mlp(), num_modules=2), "
     "strategy='bogus')", False),
    ("InterlockModel placement='bogus'",
     "ti.InterlockModel(ti.from_keras(mlp(), num_modules=2), "
     "placement='bogus')", False),
    ("fit([X], Y)", "compiled().fit([X], Y, verbose=0)", False),
    ("fit x and y of different lengths",
     "compiled().fit(X, Y[:50], verbose=0)", False),
    ("fit batch_size=-16", "compiled().fit(X, Y, batch_size=-16, verbose=0)",
     False),
    ("fit batch_size=16.5",
     "compiled().fit(X, Y, batch_size=16.5, verbose=0)", False),
    ("fit epochs=-1", "compiled().fit(X, Y, epochs=-1, verbose=0)", False),
    ("fit before compile",
     "ti.InterlockModel(ti.from_keras(mlp(), num_modules=2)).fit(X, Y)",
     False),
    ("fit x of the wrong width",
     "compiled().fit(X[:, :5], Y, verbose=0)", False),
    ("compile steps_per_execution=100 then fit",
     "m = ti.InterlockModel(ti.from_keras(mlp(), num_modules=2))\n"
     "  m.compile(optimizer='sgd', loss=keras.losses."
     "SparseCategoricalCrossentropy(from_logits=True), "
     "steps_per_execution=100)\n  m.fit(X, Y, batch_size=8, verbose=0)",
     False),
    ("export_saved_model twice into one folder",
     "m = compiled(); m.fit(X, Y, verbose=0)\n"
     "  d = sys.argv[1] + '/e'\n  m.export_saved_model(d)\n"
     "  m.export_saved_model(d)", False),
    ("export_saved_model into a file",
     "m = compiled(); m.fit(X, Y, verbose=0)\n"
     "  open(sys.argv[1] + '/f', 'w').close()\n"
     "  m.export_saved_model(sys.argv[1] + '/f')", False),
    ("predict exit=5 on K=2", "compiled().predict(X, exit=5, verbose=0)",
     False),
    ("evaluate y of another length",
     "m = compiled(); m.evaluate(X, Y[:10], verbose=0)", False),
    # Issue 35: no bad input trains in silence, and its first line says so.
    ("fit with NaN in x",
     "X[5, 2] = np.nan; compiled().fit(X, Y, verbose=0)", False),
    ("fit with a NaN sample_weight",
     "w = np.ones(64); w[3] = np.nan\n"
     "  compiled().fit(X, Y, sample_weight=w, verbose=0)", False),
    ("fit labels 3 of 3 classes, jit_compile",
     "m = compiled(); m.compile(optimizer='sgd', loss=keras.losses."
     "SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)\n"
     "  Y[7] = 3; m.fit(X, Y, verbose=0)", False),
    ("fit label -1", "Y[0] = -1; compiled().fit(X, Y, verbose=0)", False),
    ("fit float labels 0.5",
     "compiled().fit(X, Y + 0.5, verbose=0)", False),
    ("fit a dataset with labels out of range",
     "import tensorflow as tf\n"
     "  d = tf.data.Dataset.from_tensor_slices((X, Y + 5)).batch(\n"
     "      16, drop_remainder=True)\n  compiled().fit(d, verbose=0)", False),
    ("fit a Python generator",
     "compiled().fit(((X[:16], Y[:16]) for _ in range(3)), verbose=0)",
     False),
    ("train_on_batch of no examples",
     "compiled().train_on_batch(X[:0], Y[:0])", False),
    ("predict x of the wrong width",
     "m = compiled(); m.fit(X, Y, verbose=0); m.predict(X[:, :5], verbose=0)",
     False),
    ("InterlockModel with one module twice",
     "p = ti.from_keras(mlp(), num_modules=2)\n"
     "  ti.InterlockModel([p[0], p[1], p[0]])", False),
]


def api_cases():
  return [Case(f"API {name}", "-c", [API_HEAD + "  " + body + API_TAIL,
                                     "WORK"], expect="api", api_ok=ok,
               limit_s=300) for name, body, ok in API]
