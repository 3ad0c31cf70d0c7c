"""Builds orbbec: one native extension, orbbec._C, holding every op's CPU kernels and, when CUDA is
available (or FORCE_CUDA=1), their CUDA kernels; plus orbbec.warpaffine._opencv when OpenCV's C++
headers are found (pkg-config opencv4). See docs/building.md."""
import glob
import os
import subprocess
import sys
import sysconfig

from setuptools import Command, find_packages, setup

import torch
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension, CUDA_HOME

ROOT = os.path.dirname(os.path.abspath(__file__))


def _sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


def _want_cuda():
    if os.environ.get("FORCE_CUDA", "0") == "1":
        return True
    return torch.cuda.is_available() and CUDA_HOME is not None


def _arch_list():
    # TORCH_CUDA_ARCH_LIST is read by torch's BuildExtension itself; when it is unset, torch builds
    # for the GPUs it sees, and with no GPU (FORCE_CUDA=1 on a build machine) we choose sm_90.
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"


def _opencv_flags():
    if os.environ.get("ORBBEC_WITH_OPENCV", "1") == "0":
        return None
    try:
        cflags = subprocess.check_output(["pkg-config", "--cflags", "opencv4"], text=True).split()
        libs = subprocess.check_output(["pkg-config", "--libs", "opencv4"], text=True).split()
    except (OSError, subprocess.CalledProcessError):
        return None
    include_dirs = [f[2:] for f in cflags if f.startswith("-I")]
    if not any(os.path.exists(os.path.join(d, "opencv2", "imgproc.hpp")) for d in include_dirs):
        return None
    wanted = {"-lopencv_core", "-lopencv_imgproc"}
    return include_dirs, [f for f in libs if f.startswith("-L")], [f[2:] for f in libs if f in wanted]


def _nvjpeg():
    """nvJPEG's header and library for orbbec.io's GPU decoder: from the CUDA toolkit, else from the
    `nvidia-nvjpeg` wheel (PyPI). Returns (include_dir, library_dir, library_file) or None."""
    if os.environ.get("ORBBEC_WITH_NVJPEG", "1") == "0":
        return None
    roots = []
    if CUDA_HOME:
        roots.append((os.path.join(CUDA_HOME, "include"), [os.path.join(CUDA_HOME, d) for d in ("lib64", "lib", "targets/x86_64-linux/lib")]))
    try:
        import nvidia  # namespace package of NVIDIA's wheels

        for base in nvidia.__path__:
            for sub in sorted(glob.glob(os.path.join(base, "cu*"))) + [os.path.join(base, "nvjpeg")]:
                roots.append((os.path.join(sub, "include"), [os.path.join(sub, "lib")]))
    except ImportError:
        pass
    for inc, libdirs in roots:
        if not os.path.exists(os.path.join(inc, "nvjpeg.h")):
            continue
        for libdir in libdirs:
            libs = sorted(glob.glob(os.path.join(libdir, "libnvjpeg.so*")), key=len)
            if libs:
                return inc, libdir, os.path.basename(libs[0])
    return None


class BuildExt(BuildExtension.with_options(use_ninja=True)):
    # ninja already compiles one extension's files in parallel; building two extensions at once
    # (setup.py build_ext -j N) would make them share one build.ninja and fail at link time.
    def finalize_options(self):
        super().finalize_options()
        self.parallel = None


class Develop(Command):
    """`python setup.py develop`: build the extensions in place and put this checkout on sys.path.
    (setuptools 80 turned `develop` into an isolated `pip install -e .`, whose build environment
    has no torch.) `pip install --no-build-isolation -e .` is the usual way."""

    description = "build in place and add this checkout to sys.path"
    user_options = []

    def initialize_options(self):
        pass

    def finalize_options(self):
        pass

    def run(self):
        build_ext = self.distribution.get_command_obj("build_ext")
        build_ext.inplace = 1
        self.run_command("build_ext")
        site_packages = sysconfig.get_paths()["purelib"]
        with open(os.path.join(site_packages, "orbbec-develop.pth"), "w") as f:
            f.write(ROOT + "\n")
        print(f"orbbec: built in place; {ROOT} added to sys.path via {site_packages}/orbbec-develop.pth")


def extensions():
    with_cuda = _want_cuda()
    cpp = [s for s in _sources("orbbec/**/src/**/*.cpp") if not s.endswith("_opencv.cpp")]
    define = [("ORBBEC_TORCH_VERSION", '"%s"' % torch.__version__.split("+")[0])]
    # -ffp-contract=off (host) and --fmad=false (device): no fused multiply-adds on either side, so
    # CPU and CUDA kernels round each step alike and agree bit for bit (roi_align's max pooling picks
    # the same sample on both; with fmas on the GPU only, near-ties went different ways).
    cxx = ["-O3", "-std=c++20", "-fopenmp", "-fno-math-errno", "-fvisibility=hidden", "-ffp-contract=off"]
    include_dirs = [os.path.join(ROOT, "orbbec")]
    if with_cuda:
        _arch_list()
        cuda_defines, link = [("WITH_CUDA", None)], ["-fopenmp"]
        nvjpeg = _nvjpeg()
        if nvjpeg is not None:
            inc, libdir, lib = nvjpeg
            include_dirs.append(inc)
            cuda_defines.append(("WITH_NVJPEG", None))
            link += [f"-L{libdir}", f"-l:{lib}", f"-Wl,-rpath,{libdir}"]
            print(f"orbbec: nvJPEG from {libdir}/{lib}", file=sys.stderr)
        else:
            print("orbbec: nvJPEG not found (CUDA toolkit or `pip install nvidia-nvjpeg`); "
                  "orbbec.io decodes on the CPU only", file=sys.stderr)
        ext = CUDAExtension(
            "orbbec._C",
            cpp + _sources("orbbec/**/src/**/*.cu"),
            include_dirs=include_dirs,
            define_macros=define + cuda_defines,
            extra_compile_args={"cxx": cxx, "nvcc": ["-O3", "-std=c++20", "--expt-relaxed-constexpr", "--fmad=false", "-lineinfo"]},
            extra_link_args=link,
        )
    else:
        ext = CppExtension("orbbec._C", cpp, include_dirs=include_dirs, define_macros=define,
                           extra_compile_args={"cxx": cxx}, extra_link_args=["-fopenmp"])
    exts = [ext]
    opencv = _opencv_flags()
    if opencv is not None:
        import pybind11

        inc, libdirs, libs = opencv
        exts.append(CppExtension(
            "orbbec.warpaffine._opencv",
            ["orbbec/warpaffine/src/warpaffine_opencv.cpp"],
            include_dirs=inc + [pybind11.get_include()],
            library_dirs=[d[2:] for d in libdirs],
            libraries=libs,
            extra_compile_args={"cxx": ["-O3", "-std=c++20"]},
        ))
    else:
        print("orbbec: OpenCV C++ headers not found (pkg-config opencv4); affine_opencv is not built", file=sys.stderr)
    return exts


setup(
    name="orbbec",
    version="0.1.0",
    description="GPU data augmentation ops for PyTorch: warp affine, NMS, RoIAlign",
    packages=find_packages(include=["orbbec", "orbbec.*"]),
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExt, "develop": Develop},
    python_requires=">=3.9",
    zip_safe=False,
)
