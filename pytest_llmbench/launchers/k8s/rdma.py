"""RDMA for multi-node GPU cases on OKE: what a pod needs to reach the node's RoCE NICs, per shape.

A profile's ``[k8s] rdma = "BM.GPU.H100.8"`` names a row here. A case of that profile whose ranks
span nodes then runs as Oracle's own NCCL manifests for the shape do (oracle-quickstart/oci-hpc-oke,
``manifests/nccl-tests/host-network/``): on the host's network (``hostNetwork``, DNS
``ClusterFirstWithHostNet``), with the node's ``/dev/infiniband`` mounted, a privileged container
with ``IPC_LOCK`` (NCCL pins its buffers), run as root as those manifests are (capabilities added
to a non-root container are not in its effective set, kubernetes#56374: as uid 1000 NCCL's memory
registration would depend on the node's locked-memory limit), and the shape's NCCL settings below
(which RDMA devices, the RoCE GID index and traffic class). Without it NCCL finds no RDMA device in the pod
and runs over the pod network's TCP sockets; the profile's ``min_busbw_gbps`` collectives check
then fails and says so (pytest_llmbench/verdicts.py). A single-node case needs none of it and
keeps the restricted pod (no host network, no privilege, every capability dropped).

The cluster must have the RDMA network set up as oci-hpc-oke describes (its GPU node image with
the OFED drivers, RDMA namespace mode ``exclusive``), and the namespace must admit privileged,
host-network pods (Pod Security "privileged").
"""

from __future__ import annotations

from dataclasses import dataclass, field

SOURCE = "oracle-quickstart/oci-hpc-oke manifests/nccl-tests/host-network/kueue/<shape>.yaml"

# What every OCI RoCE shape sets (the same in each of those manifests): RoCE v2 GID index 3,
# traffic class 41 and service level 0 of OCI's cluster network, an IB timeout of 22, one QP's data
# not split, the bootstrap on the host's primary NIC, NCCL's own CPU affinity.
COMMON_ENV = {"NCCL_IB_DISABLE": "0", "NCCL_IB_GID_INDEX": "3", "NCCL_IB_TC": "41", "NCCL_IB_SL": "0",
              "NCCL_IB_TIMEOUT": "22", "NCCL_IB_SPLIT_DATA_ON_QPS": "0", "NCCL_SOCKET_IFNAME": "eth0",
              "NCCL_IGNORE_CPU_AFFINITY": "1"}


@dataclass(frozen=True)
class RdmaNetwork:
    """One OCI shape's RDMA devices (NCCL_IB_HCA, ``=``: exactly these) and its own settings."""

    shape: str
    hca: str
    env: dict[str, str] = field(default_factory=dict)

    def nccl_env(self) -> dict[str, str]:
        return {**COMMON_ENV, "NCCL_IB_HCA": self.hca, **self.env}


NETWORKS = {n.shape: n for n in (
    RdmaNetwork("BM.GPU.H100.8", "=mlx5_0,mlx5_1,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7,mlx5_8,mlx5_9,mlx5_10,"
                                 "mlx5_12,mlx5_13,mlx5_14,mlx5_15,mlx5_16,mlx5_17",
                {"NCCL_CUMEM_ENABLE": "0"}),
    RdmaNetwork("BM.GPU.H200.8", "=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11",
                {"NCCL_CUMEM_ENABLE": "0"}),
    RdmaNetwork("BM.GPU.A100-v2.8", "=mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7,mlx5_8,mlx5_14,"
                                    "mlx5_15,mlx5_16,mlx5_17,mlx5_9,mlx5_10,mlx5_11,mlx5_12",
                {"NCCL_IB_QPS_PER_CONNECTION": "4"}),
    RdmaNetwork("BM.GPU4.8", "=mlx5_0,mlx5_2,mlx5_6,mlx5_8,mlx5_10,mlx5_12,mlx5_14,mlx5_16,mlx5_1,mlx5_3,"
                             "mlx5_7,mlx5_9,mlx5_11,mlx5_13,mlx5_15,mlx5_17",
                {"NCCL_IB_QPS_PER_CONNECTION": "4"}),
)}


def network_problem(value: object) -> str | None:
    """Why ``value`` is not a shape of the table, or None."""
    if not isinstance(value, str) or value not in NETWORKS:
        return f"is not an RDMA shape of this table; known: {', '.join(NETWORKS)}"
    return None
