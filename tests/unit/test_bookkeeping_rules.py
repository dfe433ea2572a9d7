"""harness/bookkeeping.py's DDP rule where no CPU run of the harness shows it: torch's bf16 gradient
hook (variant bf16-reduce on DDP, which the harness runs only on CUDA), run here on a bucket of its own
under the bookkeeping instrument's tally. The reducer's own copies around it are held
to a real ws2 step by tests/harness/test_bookkeeping.py."""

import pytest
import torch
import torch.distributed as dist

from harness import bookkeeping
from harness.instruments import bookkeeping as instrument


@pytest.fixture
def one_rank(monkeypatch):
    """A one-rank gloo group whose all-reduce has finished when the hook gets it back, so that the hook's
    ``then`` runs its decompress at once on this thread, under the tally (otherwise it may run on gloo's
    thread, where the mode is not): the same operators, only when they run."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    all_reduce = dist.all_reduce

    def finished(*args, **kwargs):
        work = all_reduce(*args, **kwargs)
        work.wait()
        return work

    monkeypatch.setattr(dist, "all_reduce", finished)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_bf16_hooks_cast_divide_and_copy_back_are_the_stated_bytes(one_rank):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    bucket = torch.randn(1000)  # fp32 gradients (g 4), as DDP's autocast keeps them
    mode, tally, _ = instrument.tallying()
    with mode():
        reduced = default_hooks.bf16_compress_hook(None, (bucket,)).wait()
    assert reduced is bucket  # decompressed in place into the bucket
    s = bookkeeping.Sizes(n=1, m=1, params=bucket.numel(), gathered=0, reduced=0, p=4, r=2, hook="bf16")
    hooks = {(t.where, t.op): t.bytes for t in bookkeeping.stated("ddp_reducer", s)
             if t.where.startswith(bookkeeping.DDP_HOOKS)}
    assert hooks == {(bookkeeping.DDP_HOOKS + "_compress_hook", "aten._to_copy"): 6000,
                     (bookkeeping.DDP_HOOKS + "_compress_hook", "aten.div_"): 4000,
                     (bookkeeping.DDP_HOOKS + "decompress", "aten.copy_"): 6000}
    assert dict(tally) == hooks


def test_ddp_with_a_hook_copies_into_the_bucket_without_dividing_and_powersgd_is_not_stated():
    """With a comm hook the reducer copies each gradient into its bucket (the hook divides), without one
    it divides on the way (reducer.cpp mark_variable_ready_dense); PowerSGD's factors are not stated."""
    plain = bookkeeping.Sizes(n=8, m=2, params=100, gathered=0, reduced=0, p=4, r=4)
    rows = {(t.what, t.op): t.bytes for t in bookkeeping.stated("ddp_reducer", plain)}
    assert rows == {("gradients into the buckets, divided by N", "aten.mul"): 800,
                    ("buckets back into the gradients", "aten.copy_"): 800,
                    ("gradients accumulated under no_sync", "aten.add_"): 1200}
    hooked = {t.what for t in bookkeeping.stated("ddp_reducer", bookkeeping.Sizes(
        n=8, m=1, params=100, gathered=0, reduced=0, p=4, r=2, hook="bf16"))}
    assert "gradients into the buckets" in hooked and "gradients into the buckets, divided by N" not in hooked
    powersgd = bookkeeping.Sizes(n=8, m=1, params=100, gathered=0, reduced=0, p=4, r=4, hook="powersgd")
    assert bookkeeping.stated("ddp_reducer", powersgd) is None
    assert bookkeeping.total("ddp_reducer", powersgd) == 0
