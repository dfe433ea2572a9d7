import json,sys,time
sys.path.insert(0,'tools'); sys.path.insert(0,'.')
import fit_steptime as F
from pytest_llmbench.planner import validation, steptime
rows=json.loads(F.DATA.read_text())["rows"]
mode=sys.argv[1]
if mode=="fused":
    for r in rows:
        if r["source"].startswith("llm-foundry"): r["loss"]="fused"
t=time.time()
v=validation.validate(rows)
print("shipped FIT:", f"mean {v.mean_abs_error:.2%} max {v.max_abs_error:.2%}")
fit=F.fitted(rows)
print("fit", fit, f"{time.time()-t:.0f}s")
v=validation.validate(rows,fit)
print(F.summary(v))
for r in sorted(v.rows,key=lambda r:-abs(r['error']))[:8]:
    print(r['device'],r['model'],r['seq_len'],r['recompute'],f"{r['error']:+.1%}")
F.cross_validate(rows)
print(f"{time.time()-t:.0f}s")
