# Session 26 experiment (bench/results/h100_gpu_session26.txt, calls 6-7; not kept): every warp-per-row kernel (and block-per-row one) asks L2 for its next row of each row
# array (cp.async.bulk.prefetch, one lane) at the start of each row, so that DRAM has the next rows in flight.
# Usage: python3 session26_prefetch.py PRINTED/src/gpt2_cuda.cu OUT.cu
import re, sys
src, dst = sys.argv[1], sys.argv[2]
L = open(src).read().split('\n')
WARP = 'for (int o = blockIdx.x * (int)(blockDim.x / 32) + threadIdx.x / 32; o < n_o; o += (int)gridDim.x * (blockDim.x / 32)) {'
BLOCK = 'for (int o = blockIdx.x; o < n_o; o += gridDim.x) {'
out, n = [], 0
i = 0
while i < len(L):
    line = L[i]
    out.append(line)
    s = line.strip()
    if s == WARP or s == BLOCK:
        # the row arrays read in this loop (up to the kernel's end)
        names = []
        j = i + 1
        while j < len(L) and not L[j].startswith('}'):
            for m in re.finditer(r'\(\(const gpt2_vec<uint16_t, 8> \*\)\((\w+) \+ o \* n_r\)\)\[rv\]', L[j]):
                if m.group(1) not in names:
                    names.append(m.group(1))
            j += 1
        if names:
            stride = '(int)gridDim.x * (blockDim.x / 32)' if s == WARP else '(int)gridDim.x'
            ind = ' ' * (len(line) - len(line.lstrip()) + 2)
            out.append(f'{ind}if (threadIdx.x % {32 if s == WARP else 1024} == 0 && nrv && o + {stride} < n_o) {{  /* the next row into L2 */')
            for nm in names:
                out.append(f'{ind}  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"({nm} + (o + {stride}) * n_r), "r"(n_r * 2) : "memory");')
            out.append(f'{ind}}}')
            n += 1
    i += 1
open(dst, 'w').write('\n'.join(out))
print('prefetching in', n, 'loops')
