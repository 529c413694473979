"""`fine_tune(..., cluster=, hosts=)` hands both to the launcher: with more hosts than the
session's 2-node cluster has, the launch is refused with the cluster's own figures, after
`fine_tune` checked and tokenized its data and before anything started on a host. (A training
run on two CPU "hosts" would only show two independent trainings: what a slice's multi-host
PJRT makes of it shows on a real slice, docs/pods.md.)"""

from __future__ import annotations

import pytest

import hfxla_nb as hx
from hfxla_nb.demo import demo_dataset, demo_model_dir


def test_fine_tune_passes_cluster_and_hosts_to_the_launch(cluster, tmp_path):
    before = hx.last_launch()
    with pytest.raises(hx.LaunchRefusedError, match=r"hosts=3 asks for 3 hosts of 4 TPU chips, "
                       r"and the cluster has 2 nodes \(2 with 4 TPU chips\)"):
        hx.fine_tune(demo_model_dir(), demo_dataset(n=64), cluster=cluster.address, hosts=3,
                     epochs=1, batch_size=8,
                     output_dir=str(tmp_path / "out"), progress=False)
    assert hx.last_launch() is before
    assert not (tmp_path / "out").exists()  # refused before anything was written
