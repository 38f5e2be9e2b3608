"""A pdx layout from vLLM's KV cache tensors (register_kv_caches): each
tensor one region reference, never one per block.

The shapes, as vLLM's attention backends give them (logical order; the
strides say the physical one):
    (num_blocks, 2, block_size, heads, head_size)   FlashAttention,
                                                     FlashInfer, Triton
    (2, num_blocks, block_size, heads, head_size)   ROCm, older FA
    (num_blocks, heads, block_size, 2 * head_size)  packed: K and V side
                                                     by side in each row
                                                     (vLLM after PR 44455)
    (num_blocks, block_size, dim)                   MLA (one latent tensor)
Inside a block the tokens' rows are NHD ([tokens][heads][dim]) or HND
([heads][tokens][dim]) by the strides. A packed cache is one tensor whose
head_dim is 2 * head_size. Several layer names may share one tensor (KV
sharing): it is one layer of the layout.
"""
import re
from dataclasses import dataclass
from typing import Dict, List, Tuple

import pdx

_LAYER_INDEX = re.compile(r"\.(\d+)\.")


def layer_index(name: str) -> int:
    """The number in "model.layers.N.self_attn.attn" (vLLM's
    extract_layer_index: the first integer between dots)."""
    m = _LAYER_INDEX.search(name)
    if not m:
        raise ValueError("KV cache %r: no layer number in its name" % name)
    return int(m.group(1))


@dataclass
class Tensor:
    """What of a tensor the layout needs (torch or not)."""
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]   # in elements
    itemsize: int
    ptr: int
    device: str               # "cpu" or "cuda:N"


def describe(t) -> Tensor:
    return Tensor(tuple(t.shape), tuple(t.stride()), t.element_size(),
                  t.data_ptr(), str(t.device))


@dataclass
class Shape:
    blocks: int
    block_tokens: int
    heads: int
    head_dim: int
    itemsize: int
    tensors: int
    order: int
    block_stride: int         # bytes
    bases: List[int]          # addresses of K (and V) block 0


def _order(tok: int, head: int, elem: int, bt: int, h: int, d: int):
    """NHD or HND by a block's strides (tokens, heads, elements), None
    when the block is no one contiguous run of either."""
    if elem == 1 and head == d and tok == h * d:
        return pdx.NHD
    if elem == 1 and tok == d and head == bt * d:
        return pdx.HND
    return None


def shape_of(name: str, t: Tensor, mla: bool = False) -> Shape:
    """mla: the model's KV is MLA's latent (vLLM's use_mla), which a later
    vLLM hands 4-D, one head: NHD whatever the head's stride (the bytes
    are the same; an LBHNC instance said HND, and MLA peers of the other
    orders refused it). Not for one head of MHA: its ranks of other TP
    sizes, with more heads, say the order their strides give."""
    s, st, es = t.shape, t.stride, t.itemsize
    if len(s) == 3:  # MLA
        if st[2] != 1 or st[1] != s[2]:
            raise ValueError("KV cache %r: MLA rows of %s not contiguous "
                             "(strides %s)" % (name, s, st))
        return Shape(s[0], s[1], 1, s[2], es, 1, pdx.NHD, st[0] * es, [t.ptr])
    if len(s) == 4:  # packed: (blocks, heads, block_size, 2 * head_size)
        blocks, h, bt, c = s
        order = pdx.NHD if mla and h == 1 and st[3] == 1 and st[2] == c \
            else _order(st[2], st[1], st[3], bt, h, c)
        if order is None:
            raise ValueError("KV cache %r: a packed block of shape %s is "
                             "not one contiguous NHD or HND run (strides "
                             "%s)" % (name, s, st))
        return Shape(blocks, bt, h, c, es, 1, order, st[0] * es, [t.ptr])
    if len(s) != 5 or 2 not in (s[0], s[1]):
        raise ValueError("KV cache %r: shape %s is none of (blocks, 2, "
                         "block_size, heads, dim), (2, blocks, ...), "
                         "(blocks, heads, block_size, 2 * dim) or "
                         "(blocks, block_size, dim)" % (name, s))
    if s[1] == 2:  # blocks first
        blocks, kv_stride, block_stride = s[0], st[1], st[0]
    else:
        blocks, kv_stride, block_stride = s[1], st[0], st[1]
    bt, h, d = s[2], s[3], s[4]
    order = _order(st[2], st[3], st[4], bt, h, d)
    if order is None:
        raise ValueError("KV cache %r: a block of shape %s is not one "
                         "contiguous NHD or HND run (strides %s)"
                         % (name, s, st))
    return Shape(blocks, bt, h, d, es, 2, order, block_stride * es,
                 [t.ptr, t.ptr + kv_stride * es])


def build(kv_caches: Dict[str, object], mla: bool = False):
    """(layout, regions, layers, cuda): layers[i] is the layer names that
    are layout layer i. Host tensors must lie in POSIX shared memory
    objects (pdx.SharedPool) the agent maps; GPU tensors in allocations
    legacy CUDA IPC can share (cudaMalloc, PyTorch's caching allocator),
    each allocation one region however many tensors it holds."""
    by_ptr: Dict[int, int] = {}
    layers: List[List[str]] = []
    shapes: List[Shape] = []
    for name in sorted(kv_caches, key=layer_index):
        t = describe(kv_caches[name])
        if t.ptr in by_ptr:
            layers[by_ptr[t.ptr]].append(name)
            continue
        by_ptr[t.ptr] = len(layers)
        layers.append([name])
        shapes.append(shape_of(name, t, mla))
    if not shapes:
        raise ValueError("no KV cache tensors to register")
    first = shapes[0]
    for names, sh in zip(layers, shapes):
        for f in ("blocks", "block_tokens", "heads", "head_dim", "itemsize",
                  "tensors", "order"):
            if getattr(sh, f) != getattr(first, f):
                raise ValueError("KV cache %r: %s %s, but %r has %s"
                                 % (names[0], f, getattr(sh, f),
                                    layers[0][0], getattr(first, f)))
    block_bytes = first.block_tokens * first.heads * first.head_dim * \
        first.itemsize
    spans = [(b, (sh.blocks - 1) * sh.block_stride + block_bytes)
             for sh in shapes for b in sh.bases]
    devices = {describe(kv_caches[names[0]]).device.split(":")[0]
               for names in layers}
    if len(devices) > 1:
        raise ValueError("KV caches on %s at once: one kind of memory, "
                         "please" % " and ".join(sorted(devices)))
    cuda = devices == {"cuda"}
    regions, refs = (pdx.cuda_regions_for(spans) if cuda
                     else pdx.regions_for(spans))
    bases, it = [], iter(refs)
    for sh in shapes:
        bases.append([next(it) for _ in sh.bases])
    lay = pdx.Layout(blocks=first.blocks, block_tokens=first.block_tokens,
                     kv_heads=first.heads, head_dim=first.head_dim,
                     dtype_bytes=first.itemsize, bases=bases,
                     block_stride=[sh.block_stride for sh in shapes],
                     tensors=first.tensors, order=first.order)
    return lay, regions, layers, cuda
