#!/usr/bin/env python3
"""Byte-exact check of one tensor-parallel rank's KV pool, written from
docs/engine.md's formula alone (no engine code): every word of positions
[0, n) of every layer and tensor, in blocks 0, 1, ... (a fresh pool's
first request), must be that of the rank's head slice of the whole
model's KV.

  tp_kv_check.py SHM LAYERS TENSORS KV_HEADS HEAD_DIM DTYPE_BYTES
                 BLOCK_TOKENS BLOCKS TP_SIZE RANK TOKEN,TOKEN,...
"""
import mmap
import struct
import sys

M = 2**64
STEP = 0x9E3779B97F4A7C15


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % M
    return z ^ (z >> 31)


def main():
    shm = sys.argv[1]
    layers, tensors, heads, head_dim, dtype, bt, blocks, tp, rank = map(
        int, sys.argv[2:11])
    tokens = [int(t) for t in sys.argv[11].split(",")]
    local = heads if tensors == 1 else heads // tp  # MLA: replicated
    head0 = 0 if tensors == 1 else rank * local
    hw = head_dim * dtype // 8
    words = local * hw
    slot = words * 8
    block_bytes = bt * slot
    with open(shm, "rb") as f:
        mem = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    h, hashes = 0x70647873796E7468, []
    for t in tokens:
        h = mix(h ^ ((t + STEP) % M))
        hashes.append(h)
    for layer in range(layers):
        for t in range(tensors):
            base = (tensors * layer + t) * blocks * block_bytes
            for p, hp in enumerate(hashes):
                key = mix(hp ^ mix(p | t << 32 | layer << 33))
                at = base + (p // bt) * block_bytes + (p % bt) * slot
                got = struct.unpack_from("<%dQ" % words, mem, at)
                want = tuple((key + (head0 * hw + j) * STEP) % M
                             for j in range(words))
                if got != want:
                    sys.exit("rank %d: layer %d tensor %d position %d "
                             "differs" % (rank, layer, t, p))
    print("rank %d: %d positions x %d layers x %d tensors exact" %
          (rank, len(tokens), layers, tensors))


main()
