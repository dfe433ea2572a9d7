import re, collections
rows = [l for l in open('sessions.log') if l.startswith(('aa','slow','env'))]
by = collections.defaultdict(list)
for l in rows:
    kind, burn = l.split()[0], l.split()[1]
    rc = int(re.search(r'rc=(\d+)', l).group(1)); secs = int(re.search(r' (\d+)s ', l).group(1))
    verdicts = re.findall(r'(ws\d)-seq128: tokens_per_s: A/B (\w+) \(new/old ([\d.]+), (\d+) rounds\)', l)
    by[(kind, burn)].append((rc, secs, verdicts))
for (kind, burn), items in sorted(by.items()):
    n = len(items); failed = sum(rc != 0 for rc, _, _ in items)
    outs = collections.Counter(v for _, _, vs in items for _, v, _, _ in vs)
    rounds = [int(r) for _, _, vs in items for *_, r in vs]
    ratios = [float(x) for _, _, vs in items for _, _, x, _ in vs]
    print(f"{kind:7} {burn}: {n} sessions, {failed} exit 1; per gate {dict(outs)}; rounds {sorted(rounds)}; "
          f"new/old {min(ratios):.3f}-{max(ratios):.3f}; {min(s for _, s, _ in items)}-{max(s for _, s, _ in items)} s")
