"""pdx-engine's synthetic model, tokenizer and request parser from Python:
ctypes over the pdx_mini_model module meson builds from engine/ (see
mini_model.c). The formulas live only in C; this is their calling
convention.

The module is $PDX_MINI_MODEL, else the build tree beside this source
tree (build/tests/python/libpdx_mini_model.so).
"""
import array
import ctypes
import os

from pdx import _clib

_P = ctypes.POINTER
_U8P = ctypes.c_void_p
_U32P = _P(ctypes.c_uint32)
_U64P = _P(ctypes.c_uint64)
_LAYOUT = _P(_clib.KvLayout)


def _path():
    env = os.environ.get("PDX_MINI_MODEL")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "build", "tests", "python",
                        "libpdx_mini_model.so")


_lib = ctypes.CDLL(_path())
for _name, _res, _args in (
    ("pdx_mv_model", ctypes.c_int, [ctypes.c_char_p, _U32P]),
    ("pdx_mv_layout_check", ctypes.c_int, [_LAYOUT]),
    ("pdx_mv_fill", None, [_LAYOUT, _U8P, _U32P, _U64P, ctypes.c_uint32,
                           ctypes.c_uint32, ctypes.c_uint32,
                           ctypes.c_uint32]),
    ("pdx_mv_next_token", ctypes.c_uint32, [_LAYOUT, _U8P, _U32P,
                                            ctypes.c_uint32,
                                            ctypes.c_uint32]),
    ("pdx_mv_check", ctypes.c_int64, [_LAYOUT, _U8P, _U32P, _U64P,
                                      ctypes.c_uint32, ctypes.c_uint32,
                                      ctypes.c_uint32]),
    ("pdx_mv_parse", ctypes.c_int,
     [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_bool, ctypes.c_char_p,
      ctypes.c_uint32, ctypes.c_uint32, _U32P, ctypes.c_size_t, _U32P,
      _U32P, _P(ctypes.c_int), ctypes.c_char_p, ctypes.c_size_t,
      ctypes.c_char_p, ctypes.c_size_t]),
    ("pdx_synth_hashes", None, [ctypes.c_uint64, _U32P, ctypes.c_size_t,
                                _U64P]),
    ("pdx_tok_encode", ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t,
                                         ctypes.c_uint32, _U32P,
                                         ctypes.c_size_t]),
    ("pdx_tok_word", ctypes.c_size_t, [ctypes.c_uint32, ctypes.c_char_p]),
):
    _f = getattr(_lib, _name)
    _f.restype, _f.argtypes = _res, _args

HASH_SEED = 0x70647873796e7468  # PDX_SYNTH_HASH_SEED
TOK_WORD_MAX = 13


def _u32(a: array.array):
    return (ctypes.c_uint32 * max(len(a), 1)).from_buffer(a) if a else None


def _u64(a: array.array):
    return (ctypes.c_uint64 * max(len(a), 1)).from_buffer(a) if a else None


class ParseError(Exception):
    """A body pdx-engine refuses: the HTTP status, the parameter at fault
    ("" when none) and the message."""

    def __init__(self, status, param, message):
        super().__init__(message)
        self.status, self.param, self.message = status, param, message


class Model:
    """A named model of common/models.c: its shape and its functions."""

    def __init__(self, name: str = "tiny"):
        out = (ctypes.c_uint32 * 7)()
        if _lib.pdx_mv_model(name.encode(), out):
            raise ValueError("unknown model %r" % name)
        self.name = name
        (self.layers, self.tensors, self.kv_heads, self.head_dim,
         self.dtype_bytes, self.block_tokens, self.vocab) = list(out)

    # --- tokens ---
    def encode(self, text: str):
        raw = text.encode()
        n = _lib.pdx_tok_encode(raw, len(raw), self.vocab, None, 0)
        out = (ctypes.c_uint32 * max(n, 1))()
        _lib.pdx_tok_encode(raw, len(raw), self.vocab, out, n)
        return list(out[:n])

    def word(self, token: int) -> str:
        buf = ctypes.create_string_buffer(TOK_WORD_MAX)
        _lib.pdx_tok_word(token, buf)
        return buf.value.decode()

    def text(self, tokens) -> str:
        """Generated text as pdx-engine writes it: words joined by
        spaces."""
        return " ".join(self.word(t) for t in tokens)

    def parse(self, body: bytes, chat: bool, served_name: str,
              max_model_len: int):
        """pdx-engine's reading of a completion body (without its
        kv_transfer_params): (prompt ids, max_tokens, stream,
        include_usage), or ParseError."""
        cap = max_model_len + 1
        toks = (ctypes.c_uint32 * cap)()
        n = ctypes.c_uint32()
        opts = (ctypes.c_uint32 * 3)()
        status = ctypes.c_int()
        param = ctypes.create_string_buffer(64)
        msg = ctypes.create_string_buffer(256)
        if _lib.pdx_mv_parse(body, len(body), chat, served_name.encode(),
                             self.vocab, max_model_len, toks, cap,
                             ctypes.byref(n), opts, ctypes.byref(status),
                             param, 64, msg, 256):
            raise ParseError(status.value, param.value.decode(),
                             msg.value.decode())
        return (list(toks[:n.value]), opts[0], bool(opts[1]),
                bool(opts[2]))

    # --- KV ---
    @staticmethod
    def extend_hashes(hashes: array.array, tokens, upto: int) -> None:
        """Extends hashes (array 'Q', the prefix hash of each position)
        to cover tokens[:upto]."""
        have = len(hashes)
        if upto <= have:
            return
        new = array.array("I", tokens[have:upto])
        out = array.array("Q", bytes(8 * len(new)))
        prev = hashes[-1] if have else HASH_SEED
        _lib.pdx_synth_hashes(prev, _u32(new), len(new), _u64(out))
        hashes.extend(out)

    @staticmethod
    def layout_ok(layout_c) -> bool:
        return _lib.pdx_mv_layout_check(ctypes.byref(layout_c)) == 0

    @staticmethod
    def fill(layout_c, base: int, blocks: array.array, hashes: array.array,
             layer: int, a: int, b: int, head0: int = 0) -> None:
        """head0: the pool's first head of the model's (a TP rank's)."""
        _lib.pdx_mv_fill(ctypes.byref(layout_c), base, _u32(blocks),
                         _u64(hashes), layer, a, b, head0)

    def next_token(self, layout_c, base: int, blocks: array.array,
                   n: int) -> int:
        return _lib.pdx_mv_next_token(ctypes.byref(layout_c), base,
                                      _u32(blocks), n, self.vocab)

    @staticmethod
    def check(layout_c, base: int, blocks: array.array, hashes: array.array,
              a: int, b: int, head0: int = 0) -> int:
        """-1 when positions [a, b) hold their KV in every layer, else the
        first position that does not."""
        return _lib.pdx_mv_check(ctypes.byref(layout_c), base, _u32(blocks),
                                 _u64(hashes), a, b, head0)
