"""Who freezes Python's heap: with GC_TRACE=<folder> and this folder on PYTHONPATH, every process
logs each gc.freeze/gc.unfreeze (with its caller) and each fork (the freeze count around it, whether
the collector is on, the thread, orbbec's start_workers flag and pause count) to <folder>/<pid>.log.
It found the heap Python 3.12 starts with frozen (docs/dev/decode.md)."""
import os

if os.environ.get("GC_TRACE"):
    import gc
    import sys
    import threading
    import traceback

    _folder = os.environ["GC_TRACE"]
    os.makedirs(_folder, exist_ok=True)

    def _log(what):
        mod = sys.modules.get("orbbec.data._stream")  # (not imported yet: "?")
        flag = f"starting={mod._starting.workers} pauses={mod._pauses}" if mod is not None else "?"
        line = (f"{what} count={gc.get_freeze_count()} collector_on={gc.isenabled()} "
                f"thread={threading.current_thread().name} {flag}")
        with open(os.path.join(_folder, f"{os.getpid()}.log"), "a") as f:
            f.write(line + "\n")

    _freeze, _unfreeze = gc.freeze, gc.unfreeze

    def freeze():
        _log("freeze before; caller " + " <- ".join(
            f"{os.path.basename(s.filename)}:{s.lineno}:{s.name}" for s in traceback.extract_stack()[-6:-1][::-1]))
        _freeze()
        _log("freeze after")

    def unfreeze():
        _log("unfreeze before")
        _unfreeze()
        _log("unfreeze after")

    gc.freeze, gc.unfreeze = freeze, unfreeze
    # registered first: its before-hook runs last and its after-hooks first, around orbbec's
    os.register_at_fork(before=lambda: _log("fork before"), after_in_parent=lambda: _log("fork parent after"),
                        after_in_child=lambda: _log("fork child after, before orbbec's hook"))
