"""Writes a JPEG set of docs/workloads.md into the file format of hw_device_probe.cu (uint64 count,
uint64 offsets[count + 1], the bytes), for measuring nvJPEG's hardware backends outside orbbec.

    python tools/dev/hw_device_probe.py jpeg-250 /tmp/face.bin"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from workloads import jpeg_set, pack_jpegs  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("set", help="a JPEG set of tools/workloads.py (jpeg-250, jpeg-500x375, jpeg-1080p, ...)")
    ap.add_argument("path", help="the file to write")
    a = ap.parse_args()
    name, path = a.set, a.path
    files = jpeg_set(name)
    flat, offsets = pack_jpegs(files)
    with open(path, "wb") as f:
        f.write(np.uint64(len(files)).tobytes())
        f.write(np.array(offsets, np.uint64).tobytes())
        f.write(flat.tobytes())
    print(f"{name}: {len(files)} JPEGs, {offsets[-1] / len(files) / 1e3:.1f} kB each on average -> {path}")


if __name__ == "__main__":
    main()
