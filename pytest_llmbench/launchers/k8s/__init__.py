"""The Kubernetes launcher: a case as an Indexed Job, a JobSet or a TrainJob on a cluster.

    launcher     the launcher: render, create, watch, collect, delete (``KIND``)
    manifests    a case's objects rendered from the templates; ``python -m ... setup`` prints the Role
    kinds        Job, JobSet or TrainJob: what each kind names and labels
    cluster      the few API calls the launcher makes, retried on a busy server
    queue        Kueue, as the launcher meets it (Workloads at v1beta2)
    verdicts     what a case's objects say about it, poll by poll
    podsecurity  which Pod Security level a case's pods need
    rdma         RDMA devices, IPC_LOCK and NCCL_IB_* for a profile's network
    values       the ``[k8s]`` profile table and its checks
"""
