"""Put on the PYTHONPATH of torchrun's workers by ``python3 -m megamoe.torchrun`` on a torch
built without libuv (megamoe/torchrun.py): when ``torch.distributed.rendezvous`` is imported, its
TCPStore follows USE_LIBUV (the client torchrun's env:// rendezvous makes does not ask). Then the
interpreter's own sitecustomize, if any, runs as usual."""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_TARGET = "torch.distributed.rendezvous"


class _Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            import functools
            store = getattr(module, "TCPStore", None)
            if store is not None:
                module.TCPStore = functools.partial(
                    store, use_libuv=os.environ.get("USE_LIBUV", "1") == "1")

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("USE_LIBUV") == "0":
    sys.meta_path.insert(0, _Patch())

# the interpreter's own sitecustomize (Debian's), which this one shadows
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _HERE])
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
