"""Builds orbbec: one native extension, orbbec._C, holding every op's CPU kernels and, when CUDA is
available (or FORCE_CUDA=1), their CUDA kernels; plus orbbec.warpaffine._opencv when OpenCV's C++
headers are found (pkg-config opencv4). See docs/building.md."""
import glob
import os
import subprocess
import sys

from setuptools import setup

try:
    import torch
except ImportError:
    # pip hides a bare traceback from the build backend behind "metadata-generation-failed".
    sys.exit("orbbec: building needs torch in the build environment, and it must be the torch you will run "
             "with (the extension is compiled against its C++ ABI). Install torch first, then build with "
             "`pip install --no-build-isolation .` (docs/building.md).")
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
    try:
        import pybind11
    except ImportError:  # an install without build isolation that lacks it: build the rest
        pybind11 = opencv = None
        print("orbbec: pybind11 not installed; affine_opencv is not built", file=sys.stderr)
    if opencv is not None:
        inc, libdirs, libs = opencv
        exts.append(CppExtension(
            "orbbec.warpaffine._opencv",
            ["orbbec/warpaffine/src/warpaffine_opencv.cpp"],
            include_dirs=inc + [pybind11.get_include()],
            library_dirs=[d[2:] for d in libdirs],
            libraries=libs,
            extra_compile_args={"cxx": ["-O3", "-std=c++20"]},
        ))
    elif pybind11 is not None:
        print("orbbec: OpenCV C++ headers not found (pkg-config opencv4); affine_opencv is not built", file=sys.stderr)
    return exts


def _torch_requirement():
    # orbbec._C loads only with the torch it was compiled against (orbbec/_library.py checks), so the
    # package pins that release; a local label such as +cpu is left out, so "==2.13.0" also
    # accepts 2.13.0+cpu.
    if "pip-build-env-" in torch.__file__:
        print(f"orbbec: WARNING: building against torch {torch.__version__} of an isolated build environment; "
              "the result loads only with that torch. Use `pip install --no-build-isolation .` to build "
              "against the torch you have.", file=sys.stderr)
    return f"torch=={torch.__version__.split('+')[0]}"


setup(
    ext_modules=extensions(),
    install_requires=[_torch_requirement(), "numpy"],
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
)
