"""Data parallelism across processes: MultiWorkerMirroredStrategy, placement
"single", configured by TF_CONFIG, on two loopback processes.

Each process holds all K modules on its one device; the strategy splits
every global batch between the two and each module's Keras optimizer sums
its gradients over them. The weights must equal one process's run on the
whole batch.
"""

import pytest

from tests import cluster_jobs

STRATEGIES = ("2wise", "e2e")


@pytest.mark.cluster
def test_two_workers_equal_one_process_on_the_whole_batch(tmp_path):
  cluster_jobs.run_replica_jobs(tmp_path, "mirrored", STRATEGIES, chief=True)


@pytest.mark.cluster
def test_train_binary_two_workers_only_the_chief_writes(tmp_path,
                                                         monkeypatch):
  cluster_jobs.check_train_binary_equals_one_process(
      tmp_path, monkeypatch, "single")
