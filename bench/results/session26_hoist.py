# Session 26 experiment (bench/results/h100_gpu_session26.txt, calls 6-7; not kept): in every row kernel, the register array loaded after a "written over" __syncwarp is
# loaded at the top of the row instead (with the other arrays), so a row's loads are in flight together.
# Usage: python3 session26_hoist.py PRINTED/src/gpt2_cuda.cu OUT.cu
import re, sys
src, dst = sys.argv[1], sys.argv[2]
L = open(src).read().split('\n')
out, i, moved = [], 0, 0
while i < len(L):
    line = L[i]
    if '__syncwarp();  /*' in line and 'is written over' in line and i + 6 < len(L) and "this thread's vectors of" in L[i + 1]:
        block = L[i + 1:i + 7]           # decl, pragma, for, rv, if, assignment, closing brace
        assert block[-1].strip() == '' or True
        blk = L[i + 1:i + 8]
        assert blk[6].strip() == '}', blk
        # find the last "this thread's vectors of" load block above in this row loop (after the latest 'for (int o =')
        j = len(out) - 1
        while j >= 0 and 'for (int o = ' not in out[j]:
            j -= 1
        k = j
        last = None
        while k < len(out):
            if "this thread's vectors of" in out[k]:
                last = k
            k += 1
        if last is None:
            out.append(line); i += 1; continue
        ins = last + 7                   # after that block's closing brace
        out[ins:ins] = blk
        out.append(line)
        i += 8
        moved += 1
        continue
    out.append(line)
    i += 1
open(dst, 'w').write('\n'.join(out))
print('hoisted', moved, 'loads')
