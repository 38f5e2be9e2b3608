"""A pdx layout from SGLang's KV arguments (KVArgs.kv_data_ptrs, _lens,
_item_lens, page_size): one region reference per layer buffer, an SGLang
page being a pdx block.

SGLang's pools (get_contiguous_buf_infos) give, per buffer, its address,
its bytes and one page's bytes: an MHA pool every layer's K buffer, then
every layer's V buffer; an MLA pool one latent buffer per layer. Page p
of a buffer is at p * item_len. The bytes of one token are the layout's
kv_heads x head_dim with dtype_bytes 1: SGLang's decode side does not
tell its head count, so both sides describe a token the same way from
its bytes alone.
"""
import os
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import pdx

HEAD_DIM_MAX = 65536  # include/pdx/layout.h's bound on head_dim


@dataclass
class Shape:
    """What the two sides compare before a transfer: a rank's pool (the
    heads of an MHA pool split over the instance's TP ranks)."""
    tensors: int
    layers: int
    page_size: int
    item_lens: List[int]
    kv_heads: int = 1

    def differs(self, other: "Shape", tp: int = 1, other_tp: int = 1) -> str:
        """"" when a rank of an instance of tp ranks with this pool pairs
        with one of other_tp ranks with other's, else what differs in
        words. MHA pools of other TP sizes pair when their pages times
        their TP sizes are equal, head for head; MLA's latent is whole on
        every rank."""
        for f in ("tensors", "layers", "page_size"):
            a, b = getattr(self, f), getattr(other, f)
            if a != b:
                return "%s %s != %s" % (f, a, b)
        if tp == other_tp or self.tensors == 1:
            if self.item_lens != other.item_lens:
                return "item_lens %s != %s" % (self.item_lens,
                                               other.item_lens)
            return ""
        mine = [i * tp for i in self.item_lens]
        theirs = [i * other_tp for i in other.item_lens]
        if mine != theirs:
            return "item_lens %s x tp %d != %s x tp %d" % (
                self.item_lens, tp, other.item_lens, other_tp)
        if self.kv_heads * tp != other.kv_heads * other_tp:
            return ("kv_heads %d x tp %d != %d x tp %d (TP sizes differ: "
                    "PDX_SGLANG_TOKEN must give the model's KV heads on both "
                    "sides)" % (self.kv_heads, tp, other.kv_heads,
                                other_tp))
        return ""


def _token_split(token_bytes: int) -> Tuple[int, int]:
    """(kv_heads, head_dim) with kv_heads * head_dim == token_bytes and
    head_dim within pdx's bound: the fewest heads that fit."""
    for heads in range(1, token_bytes + 1):
        if token_bytes % heads == 0 and token_bytes // heads <= HEAD_DIM_MAX:
            return heads, token_bytes // heads
    raise ValueError("pdx.sglang: a token of %d bytes" % token_bytes)


def token_shape(token_bytes: int, tp_size: int = 1,
                is_mla: bool = False) -> Tuple[int, int, int]:
    """(kv_heads, head_dim, dtype_bytes) of a rank's token of token_bytes:
    as PDX_SGLANG_TOKEN says ("KV_HEADS,HEAD_DIM,DTYPE_BYTES", the model's,
    so that the layout matches a peer that is not SGLang, pdx-engine say,
    or an instance of another TP size; a rank of tp_size holds
    KV_HEADS / tp_size of an MHA model's heads), else bytes alone
    (dtype_bytes 1, the fewest heads that fit)."""
    spec = os.environ.get("PDX_SGLANG_TOKEN")
    if not spec:
        return _token_split(token_bytes) + (1,)
    try:
        heads, dim, dtype = (int(v) for v in spec.split(","))
    except ValueError:
        raise ValueError("pdx.sglang: PDX_SGLANG_TOKEN=%r: want "
                         "KV_HEADS,HEAD_DIM,DTYPE_BYTES" % spec) from None
    split = 1 if is_mla else tp_size
    if heads < 1 or dim < 1 or dtype < 1 or heads % split:
        raise ValueError("pdx.sglang: PDX_SGLANG_TOKEN=%s: want positive "
                         "numbers, KV_HEADS a multiple of the TP size %d"
                         % (spec, split))
    heads //= split
    if heads * dim * dtype != token_bytes:
        raise ValueError("pdx.sglang: PDX_SGLANG_TOKEN=%s is %d bytes a "
                         "token%s; SGLang's pages hold %d" %
                         (spec, heads * dim * dtype,
                          " of a rank of TP %d" % split if split > 1 else "",
                          token_bytes))
    return heads, dim, dtype


def shape_of(kv_args, is_mla: bool) -> Shape:
    ptrs, lens, items = (list(kv_args.kv_data_ptrs), list(kv_args.kv_data_lens),
                         list(kv_args.kv_item_lens))
    tensors = 1 if is_mla else 2
    if not ptrs or len(ptrs) != len(lens) or len(ptrs) != len(items):
        raise ValueError("pdx.sglang: kv_data_ptrs, kv_data_lens and "
                         "kv_item_lens must be as long (%d, %d, %d) and "
                         "not empty" % (len(ptrs), len(lens), len(items)))
    if len(ptrs) % tensors:
        raise ValueError("pdx.sglang: an MHA pool has a K and a V buffer "
                         "per layer; %d buffers" % len(ptrs))
    layers = len(ptrs) // tensors
    per_layer = items[:layers]
    for t in range(1, tensors):
        if items[t * layers:(t + 1) * layers] != per_layer:
            raise ValueError("pdx.sglang: K and V pages differ in bytes: "
                             "%s vs %s" % (per_layer,
                                           items[t * layers:(t + 1) * layers]))
    return Shape(tensors, layers, int(kv_args.page_size), per_layer)


def build(kv_args, is_mla: bool, tp_size: int = 1):
    """(Shape, pdx.Layout, regions, cuda) of a rank of an instance of
    tp_size ranks: host buffers must be in POSIX shared memory
    (pdx.SharedPool); device buffers are shared by CUDA IPC, each
    allocation one region."""
    shape = shape_of(kv_args, is_mla)
    page = shape.page_size
    if len(set(shape.item_lens)) != 1:
        raise ValueError("pdx.sglang: layers with pages of different bytes "
                         "(%s) are not one pdx layout" % sorted(
                             set(shape.item_lens)))
    item = shape.item_lens[0]
    if page < 1 or item % page:
        raise ValueError("pdx.sglang: a page of %d bytes is not %d tokens"
                         % (item, page))
    heads, dim, dtype = token_shape(item // page, tp_size, is_mla)
    shape.kv_heads = 1 if is_mla else heads
    ptrs, lens = list(kv_args.kv_data_ptrs), list(kv_args.kv_data_lens)
    blocks = min(n // i for n, i in zip(lens, kv_args.kv_item_lens))
    regions, refs, cuda = _regions(list(zip(ptrs, lens)))
    bases = [[refs[t * shape.layers + l] for t in range(shape.tensors)]
             for l in range(shape.layers)]
    lay = pdx.Layout(blocks=blocks, block_tokens=page, kv_heads=heads,
                     head_dim=dim, dtype_bytes=dtype, bases=bases,
                     block_stride=list(shape.item_lens),
                     tensors=shape.tensors)
    return shape, lay, regions, cuda


def _regions(spans: Sequence[Tuple[int, int]]):
    try:
        regions, refs = pdx.regions_for(spans)
        return regions, refs, False
    except pdx.Error as host_err:
        try:
            return pdx.cuda_regions_for(spans) + (True,)
        except pdx.Error as cuda_err:
            raise pdx.Error(pdx.EINVAL, "pdx.sglang: the KV buffers are "
                            "neither host shared memory (%s) nor CUDA IPC "
                            "memory (%s)" % (host_err.reason, cuda_err.reason))
