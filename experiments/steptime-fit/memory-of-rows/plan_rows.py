import json,subprocess,sys
d=json.load(open('tests/data/published_steps.json'))
seen=set()
for r in d['rows']:
    if r['source']!='llm-foundry-a100' and r['source']!='llm-foundry': continue
    key=(r['model'],r['world_size'],r['seq_len'],r['micro_batch'],r['recompute'])
    if key in seen: continue
    seen.add(key)
    json.dump(r['config'],open('/tmp/cfg.json','w'))
    v={'none':'base','full':'ac'}[r['recompute']]
    cmd=['.venv/bin/llmbench-plan','--model','/tmp/cfg.json','--strategy',r['strategy'],'--world-size',str(r['world_size']),
         '--seq-len',str(r['seq_len']),'--micro-batch',str(r['micro_batch']),'--grad-accum','1','--variant',v,'--precision','bf16','--json']
    out=subprocess.run(cmd,capture_output=True,text=True)
    try:
        j=json.loads(out.stdout); p=j['plans'][0]['world_sizes'][str(r['world_size'])]
        print(json.dumps({'key':key,'total_gib':round(p['total_bytes']/2**30,2),'terms':{t['name']:round(t['bytes']/2**30,2) for t in p['terms']}}),flush=True)
    except Exception as e:
        print(key,'ERR',out.stderr[-300:],out.stdout[:300],flush=True)
