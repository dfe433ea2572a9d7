"""An eviction Kueue recorded before the launcher saw the case run (launchers/k8s/verdicts.py
``kueue_eviction``, launchers/k8s/queue.py ``admitted``). On the real node (tests/offline) a preempted
case's pods ran within a second of admission: Kueue admitted, preempted and queued the Workload again
between two of the launcher's looks, then re-admitted it once the preemptor finished, and the case ran
a second time. The Workload statuses below are Kueue v0.17.1's, as it wrote them there."""

from pytest_llmbench.launchers.k8s.manifests import Placement
from pytest_llmbench.launchers.k8s.queue import admitted
from pytest_llmbench.launchers.k8s.verdicts import kueue_eviction, suspended_again

PREEMPTED = ("Preempted to accommodate a workload (UID: 9424, JobUID: d6ca) due to prioritization in the "
             "ClusterQueue; preemptor path: /contended; preemptee path: /contended")
READMITTED = {"status": {  # re-admitted after the preemptor finished: Evicted False, the count stays
    "conditions": [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
        {"type": "Evicted", "status": "False", "reason": "QuotaReserved",
         "message": "Previously: " + PREEMPTED},
        {"type": "Admitted", "status": "True", "reason": "Admitted"},
        {"type": "Requeued", "status": "True", "reason": "Preempted", "message": PREEMPTED}],
    "schedulingStats": {"evictions": [{"count": 1, "reason": "Preempted", "underlyingCause": ""}]}}}
EVICTING = {"status": {"conditions": [
    {"type": "Evicted", "status": "True", "reason": "Preempted", "message": PREEMPTED}]}}
QUEUED = {"status": {"conditions": [
    {"type": "QuotaReserved", "status": "False", "reason": "Pending",
     "message": "couldn't assign flavors to pod set main: insufficient quota"}]}}


def test_an_eviction_is_read_while_it_holds_and_after_kueue_admitted_the_workload_again():
    assert kueue_eviction(EVICTING) == f"Preempted: {PREEMPTED}"
    assert kueue_eviction(READMITTED) == f"Preempted: {PREEMPTED}"
    assert kueue_eviction(QUEUED) is None and kueue_eviction(None) is None
    assert kueue_eviction({}) is None
    evictions = [{"count": 2, "reason": "PodsReadyTimeout"}]
    counted_only = {"status": {"schedulingStats": {"evictions": evictions}}}
    assert kueue_eviction(counted_only) == "PodsReadyTimeout"


class Kube:
    """The two reads ``admitted`` makes, each answered in turn from a script (no cluster)."""

    def __init__(self, jobs, workloads):
        self.jobs, self.workloads = list(jobs), list(workloads)

    def get_job(self, name):
        return self.jobs.pop(0) if len(self.jobs) > 1 else self.jobs[0]

    def workload(self, uid):
        return self.workloads.pop(0) if len(self.workloads) > 1 else self.workloads[0]


JOB = {"metadata": {"name": "llmb-case", "uid": "u1"}}
WHERE = Placement(image="x", queue="team-c", queue_timeout_s=5.0)


def test_a_case_evicted_and_readmitted_between_two_looks_is_an_error_not_a_rerun():
    kube = Kube([{"spec": {"suspend": True}}, {"spec": {"suspend": False}}], [QUEUED, READMITTED])
    status, why = admitted(kube, JOB, WHERE, progress=lambda line: None)
    assert status == "error"
    assert why.startswith(f"Kueue evicted the Job's Workload (Preempted: {PREEMPTED}) and admitted it again")
    assert "a case is not re-run half-way" in why


def test_a_case_evicted_and_queued_again_is_an_error_at_once_not_a_wait():
    kube = Kube([{"spec": {"suspend": True}}], [QUEUED, READMITTED])
    status, why = admitted(kube, JOB, WHERE, progress=lambda line: None)
    assert status == "error" and "and queued it again" in why


def test_a_case_admitted_once_runs_and_one_never_admitted_times_out_with_kueues_reason():
    assert admitted(Kube([{"spec": {"suspend": False}}], [QUEUED]), JOB, WHERE, lambda line: None) is None
    waited = Placement(image="x", queue="team-c", queue_timeout_s=0.3)
    status, why = admitted(Kube([{"spec": {"suspend": True}}], [QUEUED]), JOB, waited, lambda line: None)
    assert status == "timeout" and "couldn't assign flavors to pod set main" in why


def test_a_job_suspended_mid_run_names_the_eviction_kueue_counted():
    status, why = suspended_again({"spec": {"suspend": True}}, lambda: READMITTED)
    assert status == "error" and f"(Kueue evicted it: Preempted: {PREEMPTED})" in why
    assert suspended_again({"spec": {"suspend": False}}, lambda: READMITTED) is None
