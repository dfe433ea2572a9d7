"""The collectives probe: all_reduce, all_gather, reduce_scatter and broadcast bandwidth over a
sweep of message sizes (nccl-tests' busbw), one case per profile and world size of 2 and up.

Selected with the same markers and --world-size as the training cases, plus ``collectives``:

    pytest -m "a10 and collectives"            # before trusting any training number there
    pytest -m "cpu and not collectives"        # training cases only

A profile's ``min_busbw_gbps`` threshold fails a cluster whose links are misconfigured.
"""


def test_collectives(llmbench, llmbench_probe):
    result = llmbench.run(llmbench_probe)
    llmbench.check(result)
