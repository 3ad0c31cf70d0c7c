"""Which shared libraries a process loaded: which nvJPEG orbbec uses follows LD_LIBRARY_PATH (a
peer's wheels, such as DALI's, can put theirs ahead of the one orbbec was built with), so the tools
that time the decoder name it."""
import os


def mapped_library(prefix):
    """The path of the shared library named prefix* mapped into this process (Linux), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path (may hold spaces)
                path = fields[5].strip() if len(fields) == 6 else ""
                if os.path.basename(path).startswith(prefix):
                    return path
    except OSError:
        pass
    return None
