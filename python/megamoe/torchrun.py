"""``python3 -m megamoe.torchrun ...``: torchrun (``torch.distributed.run``, same arguments) that
also works on torch builds without libuv, such as Debian 13's python3-torch 2.6.

torch 2.4+ makes libuv its TCPStore's default backend; a build without libuv refuses it
("use_libuv was requested but PyTorch was build without libuv support"). ``init_process_group``
honours ``USE_LIBUV=0``, but torchrun's rendezvous (static and c10d) creates its TCPStore without
asking, and so does the workers' env:// rendezvous under torchrun (a client of the agent's
store): torchrun fails there whatever the script does. This module makes those TCPStores follow
``USE_LIBUV`` (set to 0 here when the build has no libuv) — in the launcher directly, in the
workers through a ``sitecustomize`` on their PYTHONPATH that patches
``torch.distributed.rendezvous`` when it is imported (and then runs the interpreter's own
sitecustomize) — and runs torchrun. On torch with libuv it is torchrun, unchanged.
``megamoe launch -n N -- python3 script.py`` needs none of this.
"""
import functools
import os
import runpy

import torch.distributed as dist


def _has_libuv():
    try:
        probe = dist.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True, wait_for_workers=False)
    except RuntimeError as exc:
        if "libuv" in str(exc):
            return False
        raise
    del probe
    return True


def _follow_use_libuv():
    """Give torchrun's rendezvous TCPStores use_libuv from USE_LIBUV (0 on a build without)."""
    import re
    import torch
    if tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2]) < (2, 3):
        return  # torch < 2.3: TCPStore has no libuv backend to choose
    if "USE_LIBUV" not in os.environ and not _has_libuv():
        os.environ["USE_LIBUV"] = "0"
    use = os.environ.get("USE_LIBUV", "1") == "1"
    if not use:  # the workers' rendezvous too (megamoe/_torchrun_site/sitecustomize.py)
        site = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torchrun_site")
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (site, os.environ.get("PYTHONPATH", "")) if p)
    from torch.distributed.elastic.rendezvous import (c10d_rendezvous_backend,
                                                      static_tcp_rendezvous)
    for module in (static_tcp_rendezvous, c10d_rendezvous_backend):
        store = getattr(module, "TCPStore", None)
        if store is not None:
            module.TCPStore = functools.partial(store, use_libuv=use)


if __name__ == "__main__":
    _follow_use_libuv()
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
