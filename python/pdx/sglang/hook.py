"""The hook that puts pdx.sglang behind an SGLang backend name; SGLang at
0094505d has no backend loaded by module path (its TransferBackend enum
and get_kv_class() list mooncake, mori, nixl, ascend and fake only), so
this is a patch of SGLang in memory, said plainly: install() replaces
get_kv_class in sglang.srt.disaggregation.utils and in every module that
already imported it by name (prefill.py, decode.py, ...), so that the
backend named (default "nixl": --disaggregation-transfer-backend nixl)
hands out pdx's classes; every other backend stays SGLang's own. It must
run in every SGLang process before the scheduler builds its queues:
from SGLang's plugin framework where it has one (plugin(), the package's
entry point in the group sglang.srt.plugins), else from a sitecustomize
on PYTHONPATH (docs/sglang.md).
"""
import os
import sys

_ROLES = {"manager": "PdxKVManager", "sender": "PdxKVSender",
          "receiver": "PdxKVReceiver",
          "bootstrap_server": "PdxKVBootstrapServer"}


def install(backend: str = "nixl"):
    """Returns the patched get_kv_class; calling it again changes
    nothing."""
    from sglang.srt.disaggregation import utils

    original = getattr(utils.get_kv_class, "__pdx_original__",
                       utils.get_kv_class)

    def get_kv_class(transfer_backend, class_type, *args, **kwargs):
        role = getattr(class_type, "value", class_type)
        name = getattr(transfer_backend, "value", transfer_backend)
        if name != backend or role not in _ROLES:
            return original(transfer_backend, class_type, *args, **kwargs)
        import pdx.sglang
        return getattr(pdx.sglang, _ROLES[role])

    get_kv_class.__pdx_original__ = original
    for mod in list(sys.modules.values()):
        name = getattr(mod, "__name__", "") or ""
        if name.startswith("sglang") and \
                getattr(mod, "get_kv_class", None) in (original,
                                                        utils.get_kv_class):
            mod.get_kv_class = get_kv_class
    utils.get_kv_class = get_kv_class
    return get_kv_class


def plugin():
    """SGLang's general plugin (the package's entry point in the group
    sglang.srt.plugins): its load_plugins() calls it with no arguments,
    early in every process, where SGLang has that framework. Installs the
    hook for the backend PDX_SGLANG names; without it, nothing (an SGLang
    beside an installed pdx that did not ask keeps its own backends)."""
    backend = os.environ.get("PDX_SGLANG")
    if backend:
        install(backend)
