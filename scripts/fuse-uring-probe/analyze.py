import sys, statistics as st, collections
phases=["create","stat","unlink","write3901","read4k","unlink_w"]
def load(fn):
    d=collections.defaultdict(list)
    for l in open(fn):
        if l.startswith('#'): continue
        f=l.split()
        if len(f)!=10: continue
        r,mode,np_,ph=f[0],f[1],int(f[2]),f[3]
        d[(mode,np_,ph)].append((float(f[6]),float(f[8]),float(f[9]),int(f[7])))
    return d
for fn in sys.argv[1:]:
    d=load(fn)
    modes=sorted({k[0] for k in d}, key=lambda m:(m=='uring', m!='shm', m))
    cls=[m for m in modes if m.startswith('classic')]
    print(f"## {fn}: median ops/s over {len(d[(modes[0],1,'create')])} rounds  [min-max]; cpu = median bench+daemon CPU us/op")
    for np_ in (1,2):
        print(f"### {np_} process(es)")
        hdr="| phase | "+" | ".join(modes)+" | "+" | ".join(f"uring/{c}" for c in cls)+" | cpu us/op "+" / ".join(m for m in modes if m!='shm')+" |"
        print(hdr); print("|"+"---|"*(hdr.count('|')-1))
        for ph in phases:
            row=[ph]; med={}
            for m in modes:
                v=[x[0] for x in d[(m,np_,ph)]]
                med[m]=st.median(v)
                row.append(f"{med[m]:.0f} [{min(v):.0f}-{max(v):.0f}]")
                assert sum(x[3] for x in d[(m,np_,ph)])==0
            for c in cls: row.append(f"{med['uring']/med[c]:.2f}")
            row.append(" / ".join(f"{st.median([x[1]+x[2] for x in d[(m,np_,ph)]]):.0f}" for m in modes if m!='shm'))
            print("| "+" | ".join(row)+" |")
