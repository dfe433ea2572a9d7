"""Hold overlap at a value (argv[1]) and fit gemm, attention and memory; the summary and the
leave-one-source-out table. .venv/bin/python experiments/steptime-fit/overlap_held.py 0.609"""
import json,sys,time
from dataclasses import replace
sys.path.insert(0, 'tools'); sys.path.insert(0, '.')
import fit_steptime as F
from pytest_llmbench.planner import validation, steptime
rows=json.loads(F.DATA.read_text())["rows"]
steptime.FIT=replace(steptime.FIT, overlap=float(sys.argv[1]))
F.FREE=("gemm","attention","memory")
t=time.time()
fit=F.fitted(rows)
print("fit", {k:round(getattr(fit,k),4) for k in ("gemm","attention","memory","overlap")}, f"{time.time()-t:.0f}s")
v=validation.validate(rows,fit)
print(F.summary(v))
for r in sorted(v.rows,key=lambda r:-abs(r['error']))[:6]:
    print(r['device'],r['model'],r['seq_len'],r['world_size'],r['recompute'],f"{r['error']:+.1%}")
F.cross_validate(rows)
