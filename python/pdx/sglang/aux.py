"""SGLang's auxiliary rows (MetadataBuffers.get_buf_infos: KVArgs.aux_
data_ptrs, one row of aux_item_lens bytes per request at the request's
metadata_buffer_index): what pdx carries of them.

pdx carries the first output token with the transfer (output_ids, the
first buffer, int32). The last buffer is bootstrap_room (uint64), which
SGLang's decode side reads to accept a transfer (utils._apply_metadata_
gate: Success counts only once the row holds the room): the receiver
writes the room it received for. The other rows (cached token counts,
logprobs, speculative top-k and hidden states) do not travel: they stay
zero on the decode side.
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

    def first_token(self, row: int):
        """The prefill side's output_ids[row][0], or None without rows."""
        at = self._at(0, row, 4)
        return ctypes.c_int32.from_address(at).value if at else None

    def land(self, row: int, first_token, room: int) -> None:
        """The decode side's row: output_ids[row][0] and
        bootstrap_room[row][0]."""
        if first_token is not None:
            at = self._at(0, row, 4)
            if at:
                ctypes.c_int32.from_address(at).value = first_token
        at = self._at(len(self.ptrs) - 1, row, 8)
        if at:
            ctypes.c_uint64.from_address(at).value = room & (2**64 - 1)
