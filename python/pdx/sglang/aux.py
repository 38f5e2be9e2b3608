"""SGLang's auxiliary rows (MetadataBuffers.get_buf_infos: KVArgs.aux_
data_ptrs, one row of aux_item_lens bytes per request at the request's
metadata_buffer_index): what pdx carries of them.

Every row but the last travels beside the KV, as the transfer's meta
(pdx.Engine.meta, at most pdx.META_MAX bytes): output_ids (the first
output token), cached_tokens, the logprobs, speculative decoding's top-k
and hidden states, as the commit has them, in buffer order. The first
token also goes as the transfer's first token, which is all a pdx-engine
on the other side sends or reads. The last buffer is bootstrap_room
(uint64), which SGLang's decode side reads to accept a transfer
(utils._apply_metadata_gate: Success counts only once the row holds the
room): the receiver writes the room it received for.
"""
import ctypes


class AuxRows:
    def __init__(self, kv_args):
        self.ptrs = list(getattr(kv_args, "aux_data_ptrs", None) or [])
        self.lens = list(getattr(kv_args, "aux_data_lens", None) or [])
        self.items = list(getattr(kv_args, "aux_item_lens", None) or [])

    def _at(self, buf: int, row: int, size: int) -> int:
        if not self.ptrs or row is None or row < 0:
            return 0
        off = row * self.items[buf]
        if off + size > self.lens[buf]:
            raise IndexError("pdx.sglang: aux row %d is past buffer %d "
                             "(%d bytes)" % (row, buf, self.lens[buf]))
        return self.ptrs[buf] + off

    def _carried(self):
        """The buffers that travel: all but bootstrap_room."""
        return range(len(self.ptrs) - 1)

    def first_token(self, row: int):
        """The prefill side's output_ids[row][0], or None without rows."""
        at = self._at(0, row, 4)
        return ctypes.c_int32.from_address(at).value if at else None

    def pack(self, row: int) -> bytes:
        """The prefill side's row of every carried buffer, in order."""
        out = []
        for buf in self._carried():
            at = self._at(buf, row, self.items[buf])
            if at:
                out.append(ctypes.string_at(at, self.items[buf]))
        return b"".join(out)

    def land(self, row: int, first_token, room: int,
             rows: bytes = b"") -> None:
        """The decode side's row: the carried buffers' rows (pack()'s
        bytes, when the sender sent them), output_ids[row][0] and
        bootstrap_room[row][0]."""
        if rows:
            want = sum(self.items[b] for b in self._carried())
            if len(rows) != want:
                raise ValueError(
                    "pdx.sglang: the prefill side sent %d bytes of aux rows,"
                    " this side's rows take %d: their MetadataBuffers differ"
                    % (len(rows), want))
            off = 0
            for buf in self._carried():
                at = self._at(buf, row, self.items[buf])
                if at:
                    ctypes.memmove(at, rows[off:off + self.items[buf]],
                                   self.items[buf])
                off += self.items[buf]
        if first_token is not None:
            at = self._at(0, row, 4)
            if at:
                ctypes.c_int32.from_address(at).value = first_token
        at = self._at(len(self.ptrs) - 1, row, 8)
        if at:
            ctypes.c_uint64.from_address(at).value = room & (2**64 - 1)
