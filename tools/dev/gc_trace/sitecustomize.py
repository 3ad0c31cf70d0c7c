"""Who freezes Python's heap: with GC_TRACE=<folder> and this folder on PYTHONPATH, every process
logs each gc.freeze/gc.unfreeze (with its caller) and each fork in the parent (the freeze count
around it, the thread, whether orbbec's start_workers flag was set) to <folder>/<pid>.log."""
import os

if os.environ.get("GC_TRACE"):
    import gc
    import threading
    import traceback

    _folder = os.environ["GC_TRACE"]
    os.makedirs(_folder, exist_ok=True)

    def _log(what):
        flag = "?"
        mod = __import__("sys").modules.get("orbbec.data._stream")
        if mod is not None:
            flag = f"starting={mod._starting.workers} freezes={mod._freezes} user_froze={mod._user_froze}"
        with open(os.path.join(_folder, f"{os.getpid()}.log"), "a") as f:
            f.write(f"{what} count={gc.get_freeze_count()} thread={threading.current_thread().name} {flag}\n")

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
    # registered first: its before-hook runs last and its parent hook first, around orbbec's
    os.register_at_fork(before=lambda: _log("fork before"), after_in_parent=lambda: _log("fork parent after"))
