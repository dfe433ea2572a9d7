"""``python -m harness --spec spec.json --out result.json``, one process per rank (torchrun).

Exit codes: 0 ok; 1 the run failed (a failure result was still written); 2 bad input
(invalid spec or a world size that does not match torchrun's), one message, no traceback.

Rank 0 writes the result atomically and prints it between ``LLMBENCH_RESULT_BEGIN
<sha256>`` and ``LLMBENCH_RESULT_END``. A rank that raises writes the failure result
itself (first failing rank wins), so a crash on any rank is still a recorded result.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid

from harness.rank import die_with_parent, env_int, run_case
from harness.result import EXIT_BAD_INPUT, REJECTED
from harness.spec import SpecError
from harness.spec_file import spec_of


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True,
                        help="RunSpec JSON file, or env:NAME: the JSON in that environment variable (a "
                             "Kubeflow TrainJob's pods mount no volume of the launcher's)")
    parser.add_argument("--out", required=True, help="where rank 0 writes the BenchResult JSON")
    parser.add_argument("--run-id", default=os.environ.get("LLMBENCH_RUN_ID") or uuid.uuid4().hex[:12])
    args = parser.parse_args(argv)
    try:
        spec = spec_of(args.spec)
        problem = spec.depth_problem()
        if problem:
            raise SpecError(problem)
        rank, local_rank = env_int("RANK", 0), env_int("LOCAL_RANK", 0)
        world_size = env_int("WORLD_SIZE", 1)
        if world_size != spec.world_size:
            raise SpecError(f"world_size: spec says {spec.world_size} but torchrun started "
                            f"WORLD_SIZE={world_size} ranks")
    except SpecError as exc:
        print(f"{REJECTED} {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return run_case(spec, rank=rank, local_rank=local_rank, out=args.out, run_id=args.run_id)



if __name__ == "__main__":
    code = main()
    # The result is on disk and the process group is gone: skip the interpreter's teardown
    # of torch and DeepSpeed (~1 s per case, measured with benchmarks/launch_overhead.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
