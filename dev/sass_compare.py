"""The sm_90 SASS of two builds' CUDA objects, kernel by kernel: which of the base's kernels
are identical in the other build, which differ, which are missing, and how many are new.

    python3 dev/sass_compare.py BASE_OBJ_DIR HEAD_OBJ_DIR
    (e.g. build-a/CMakeFiles/megamoe.dir/src/cuda build-b/CMakeFiles/megamoe.dir/src/cuda)

CUOBJDUMP names the disassembler (default: cuobjdump on PATH; Triton's wheel carries one in
triton/backends/nvidia/bin). Addresses, encodings and the anonymous-namespace hashes that
depend on the source path are blanked before comparing.
"""
import os
import re
import subprocess
import sys

CU = os.environ.get("CUOBJDUMP", "cuobjdump")
def kernels(obj):
    out=subprocess.run([CU,'-sass',obj],capture_output=True,text=True).stdout
    ks={}; name=None; buf=[]
    for l in out.split('\n'):
        m=re.match(r'\s*Function : (\S+)',l)
        if m:
            if name: ks[name]=buf
            name=re.sub(r'_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+','_GLOBAL__N_',m.group(1)); buf=[]; continue
        if name is None: continue
        l=re.sub(r'/\*[0-9a-f]{4,}\*/','',l)   # addresses
        l=re.sub(r'/\* 0x[0-9a-f]+ \*/','',l)  # encodings
        l=re.sub(r'_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+','_GLOBAL__N_',l)
        l=l.strip()
        if l: buf.append(l)
    if name: ks[name]=buf
    return ks
tot=same=diff=missing=new=0
for f in sorted(os.listdir(sys.argv[1])):
    if not f.endswith('.cu.o'): continue
    a=kernels(os.path.join(sys.argv[1],f)); b=kernels(os.path.join(sys.argv[2],f))
    d=[k for k in a if k in b and a[k]!=b[k]]
    miss=[k for k in a if k not in b]
    nw=[k for k in b if k not in a]
    tot+=len(a); same+=sum(1 for k in a if k in b and a[k]==b[k]); diff+=len(d); missing+=len(miss); new+=len(nw)
    print(f, 'base kernels',len(a),'identical',sum(1 for k in a if k in b and a[k]==b[k]),'differ',len(d),'missing',len(miss),'new',len(nw))
    for k in d[:3]: print('  DIFF',k[:150])
    for k in miss[:3]: print('  MISSING',k[:150])
print('total base kernels',tot,'identical',same,'differ',diff,'missing',missing,'new in head',new)
