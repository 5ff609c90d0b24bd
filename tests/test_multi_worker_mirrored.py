"""Data parallelism across processes: MultiWorkerMirroredStrategy, placement
"single", configured by TF_CONFIG, on two loopback processes.

Each process holds all K modules on its one device; the strategy splits
every global batch between the two and each module's Keras optimizer sums
its gradients over them. The weights must equal one process's run on the
whole batch.
"""

import numpy as np
import pytest

from tests import cluster_jobs
from tests import replica_job

STRATEGIES = ("2wise", "e2e")


@pytest.mark.cluster
def test_two_workers_equal_one_process_on_the_whole_batch(tmp_path):
  outs = [tmp_path / f"task_{i}.npz" for i in range(2)]
  cluster_jobs.run_cluster(
      "tests.replica_job", [[out, "mirrored", *STRATEGIES] for out in outs],
      tmp_path, chief=True)
  saved = [np.load(out) for out in outs]
  for strategy in STRATEGIES:
    weights, metrics, _ = replica_job.train(strategy)
    for task, run in enumerate(saved):
      for i, expected in enumerate(weights):
        np.testing.assert_allclose(run[f"{strategy}/w{i}"], expected,
                                   atol=1e-5, err_msg=f"{strategy} {task}")
      for key, value in metrics.items():
        if not key.endswith("grad_norm"):  # replica-local by definition
          np.testing.assert_allclose(run[f"{strategy}/{key}"], value,
                                     atol=1e-5, err_msg=key)


@pytest.mark.cluster
def test_train_binary_two_workers_only_the_chief_writes(tmp_path,
                                                         monkeypatch):
  cluster_jobs.check_train_binary_equals_one_process(
      tmp_path, monkeypatch, "single")
