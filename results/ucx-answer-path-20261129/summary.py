# Medians of each build's half round trip over ucp_am_lat's in the same round, per placement
# (close: both cache-line round trips under 250 ns; apart: both over; moved: they disagree).
# Usage: /usr/bin/python3 summary.py raw.jsonl
import json,sys,statistics as st
rows=[json.loads(l) for l in open(sys.argv[1])]
names=[k for k in rows[0] if k not in ('round','c2c','ucp','c2c_after')]
for place in ('close','apart','moved'):
    sel=[r for r in rows if (('close' if r['c2c']<250 and r['c2c_after']<250 else 'apart' if r['c2c']>=250 and r['c2c_after']>=250 else 'moved')==place)]
    if not sel: continue
    out=[f"{place} n={len(sel)} ucp={st.median([r['ucp'] for r in sel]):.4f}"]
    for n in names:
        rs=[r[n]/r['ucp'] for r in sel if r.get(n)]
        out.append(f"{n}: med ratio {st.median(rs):.3f} [{' '.join(f'{x:.3f}' for x in rs)}]")
    if len(names)==2:
        d=[r[names[1]]/r[names[0]] for r in sel if r.get(names[0]) and r.get(names[1])]
        out.append(f"{names[1]}/{names[0]} med {st.median(d):.3f}")
    print('\n  '.join(out))
