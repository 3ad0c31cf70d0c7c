"""Every thread's stacks of a process that stopped making progress: native ones through gdb (when
the machine has it), then Python ones through faulthandler (the process must have registered
SIGUSR1 with `faulthandler.register(signal.SIGUSR1, all_threads=True)`; they go to its stderr)."""
import os
import shutil
import signal
import subprocess


def save_stacks(pid: int, f) -> None:
    """The native stacks written to the open text file `f`; the Python ones asked for."""
    gdb = shutil.which("gdb") or shutil.which("cuda-gdb")
    if gdb:
        try:
            r = subprocess.run([gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
            f.write(r.stdout)
        except subprocess.TimeoutExpired:
            f.write("gdb did not finish within 120 s\n")
    else:
        f.write("no gdb on this machine\n")
    f.flush()
    os.kill(pid, signal.SIGUSR1)
