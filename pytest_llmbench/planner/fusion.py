"""What torch.compile's fusion leaves of the memory-bound operators: the eager operators that
planner/opcount.py records, grouped into the kernels inductor would generate, and the bytes those
kernels move.

The rule, inductor's fusion as its scheduler applies it to a training graph (torch/_inductor/scheduler.py
fuses a node into a producer's kernel when they share data and no path between them leaves the kernel;
matmuls and attention run as extern kernels, never fused with what they read or write):
    - a memory-bound operator joins the kernel of every memory-bound operator of the same graph it reads
      from, while that kernel is open; a kernel closes once a matmul or attention reads what it wrote
      (an operator after the matmul that joined it would make a cycle: kernel -> matmul -> kernel);
    - forward and backward are separate graphs (AOTAutograd partitions them): nothing fuses across.
A fused kernel reads each tensor from outside it once (a tensor read twice in one kernel is one read)
and writes only what something outside it reads, or what nothing reads (gradients, the loss). The
bytes a chain of eager operators passed from one to the next stay in registers.

Left out, each making the count an upper bound on inductor's bytes: horizontal fusion of independent
kernels reading the same tensor; recomputing cheap forward operators in backward instead of saving them
(the min-cut partitioner); epilogue fusion into matmuls (max-autotune only). Left out the other way:
inductor splits a kernel whose reductions differ in size, or with too many inputs (a few percent more
kernels, about the same bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _key(tensor) -> tuple[int, int, tuple]:
    """(storage, offset, shape) of ``tensor``: a view reads the part of its storage it covers."""
    return id(tensor.untyped_storage()), tensor.storage_offset(), tuple(tensor.shape)


@dataclass
class Fused:
    """The fused kernels of one graph (one phase): their count and the bytes they move."""

    kernels: int = 0
    bytes: float = 0.0


@dataclass
class Fusion:
    """Records the operators of a forward and backward as they run (``record``), then groups them
    (``totals``). Storages are held for the record's life so an id is never reused."""

    _parent: dict[int, int] = field(default_factory=dict)
    _phase_of: dict[int, str] = field(default_factory=dict)
    _closed: set[int] = field(default_factory=set)
    _producer: dict[int, int] = field(default_factory=dict)  # storage id -> memory op that last wrote it
    # per memory op: [(key, bytes, the memory op that wrote it or None)] read, [(key, bytes)] written
    _ops: list[tuple[list, list]] = field(default_factory=list)
    _readers: dict[int, set] = field(default_factory=dict)  # storage id -> memory ops (-1: others) reading
    _pinned: list = field(default_factory=list)

    def _root(self, op: int) -> int:
        while self._parent[op] != op:
            self._parent[op] = self._parent[self._parent[op]]
            op = self._parent[op]
        return op

    def record(self, phase: str, fusable: bool, ins: list, outs: list) -> None:
        """One operator of ``phase``: memory-bound (``fusable``) or a matmul / attention kernel."""
        self._pinned.extend(t.untyped_storage() for t in ins + outs)
        op = len(self._ops) if fusable else -1
        if fusable:
            self._parent[op], self._phase_of[op] = op, phase
        reads = []
        for t in ins:
            storage = id(t.untyped_storage())
            self._readers.setdefault(storage, set()).add(op)
            producer = self._producer.get(storage)
            reads.append((_key(t), t.numel() * t.element_size(), producer))
            if producer is None:
                continue
            root = self._root(producer)
            if not fusable:
                self._closed.add(root)  # a matmul read it: nothing after the matmul may join
            elif self._phase_of[root] == phase and root not in self._closed:
                self._parent[root] = op  # the open kernel grows by this operator
        if not fusable:
            for t in outs:
                self._producer.pop(id(t.untyped_storage()), None)
            return
        self._ops.append((reads, [(_key(t), t.numel() * t.element_size()) for t in outs]))
        for t in outs:
            self._producer[id(t.untyped_storage())] = op

    def totals(self) -> dict[str, Fused]:
        """{phase: Fused} over every operator recorded."""
        kernels: dict[int, list[int]] = {}
        for op in range(len(self._ops)):
            kernels.setdefault(self._root(op), []).append(op)
        out: dict[str, Fused] = {}
        for root, ops in kernels.items():
            fused = out.setdefault(self._phase_of[root], Fused())
            fused.kernels += 1
            read, written = {}, {}
            for op in ops:
                reads, writes = self._ops[op]
                read.update({key: b for key, b, producer in reads
                             if producer is None or self._root(producer) != root})
                for key, b in writes:
                    readers = self._readers.get(key[0], set())
                    if not readers or any(r == -1 or self._root(r) != root for r in readers):
                        written[key] = b
            fused.bytes += sum(read.values()) + sum(written.values())
        return out
