"""How busy the GPU's JPEG engines and SMs were, as NVML reports it (nvidia-smi dmon's jpg and sm
columns), sampled in a background thread: to tell a decoder that keeps the engines busy (the engines
are the ceiling) from one that leaves them waiting for its host side.

    use = EngineUse()            # starts sampling (NVML through ctypes: no extra package)
    ...                          # the measured work
    print(use.summary(t0, t1))   # mean busy shares over samples taken between perf_counter() t0 and t1

NVML reports each share over its own sampling period (1/6 s to 1 s, by product), so a window of a
few seconds gives a handful of independent samples; the summary says how many."""
import ctypes
import threading
import time


class _Rates(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class EngineUse:
    def __init__(self, index: int = 0, period_s: float = 0.05):
        # index: NVML's numbering (by PCI bus), which CUDA_VISIBLE_DEVICES does not renumber; the GPU
        # machine has one GPU, so 0.
        self.samples = []  # (perf_counter, jpg %, sm %); None where NVML had no figure
        self.error = None
        try:
            self.nvml = ctypes.CDLL("libnvidia-ml.so.1")
            self._check(self.nvml.nvmlInit_v2(), "nvmlInit_v2")
            self.device = ctypes.c_void_p()
            self._check(self.nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.device)),
                        "nvmlDeviceGetHandleByIndex_v2")
        except (OSError, RuntimeError) as e:  # no driver here: the summary says so instead
            self.error = str(e)
            return
        self.thread = threading.Thread(target=self._sample, args=(period_s,), name="engine-use", daemon=True)
        self.thread.start()

    @staticmethod
    def _check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} returned NVML error {rc}")

    def _sample(self, period_s):
        jpg, period, rates = ctypes.c_uint(), ctypes.c_uint(), _Rates()
        while True:  # (a daemon thread: it ends with the probe's process)
            j = self.nvml.nvmlDeviceGetJpgUtilization(self.device, ctypes.byref(jpg), ctypes.byref(period))
            r = self.nvml.nvmlDeviceGetUtilizationRates(self.device, ctypes.byref(rates))
            self.samples.append((time.perf_counter(), jpg.value if j == 0 else None, rates.gpu if r == 0 else None))
            time.sleep(period_s)

    def summary(self, t0: float, t1: float) -> str:
        if self.error:
            return f"engine use: unavailable ({self.error})"
        window = [s for s in self.samples if t0 <= s[0] <= t1]
        parts = []
        for name, k in (("JPEG engines", 1), ("SMs", 2)):
            values = [s[k] for s in window if s[k] is not None]
            if values:
                distinct = len(set(values))
                parts.append(f"{name} busy {sum(values) / len(values):.0f}% "
                             f"(min {min(values)}, max {max(values)}, {distinct} distinct readings)")
            else:
                parts.append(f"{name}: no reading")
        return "engine use: " + "; ".join(parts) + f" over {len(window)} samples"
