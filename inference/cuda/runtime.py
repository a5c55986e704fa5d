"""The device seam of the CUDA backend: memory, copies, kernel launches, GEMM and CUDA graphs.

`CUDABackend` touches its device only through one `DeviceRuntime`, so that the same backend code
runs on a GPU and, in CI, under numba's CUDA simulator:

- `CupyRuntime` (a GPU): device arrays are CuPy arrays from CuPy's memory pool; every operation
  goes on one non-blocking stream per device, on which the numba kernels are launched (CuPy
  arrays reach them through `__cuda_array_interface__`, without the per-launch stream
  synchronization numba does by default) and CuPy's own operations run; prompts multiply through
  cuBLAS (`cublasGemmEx`, fp16 inputs, float32 accumulation and output); decode steps can be
  captured into CUDA graphs (`cudaStreamBeginCapture`) and replayed.
- `SimulatedRuntime` (NUMBA_ENABLE_CUDASIM=1): device arrays are `sim_array.SimDeviceArray`s,
  numpy memory as strict at the host boundary as CuPy's arrays (no implicit conversion to numpy,
  no math with host arrays), kernels run in numba's simulator, GEMM in numpy (fp16 inputs
  widened to float32, as cuBLAS accumulates), and a "graph" is the list of operations recorded
  during a capture, replayed in order, so that what a real capture would freeze (launch
  arguments, buffers) is frozen here too. It counts what it allocates against its memory size, so running out of
  device memory can be tested.

An operation is a callable given to `op`: run now, or recorded when a graph is being captured (a
GPU records the launches itself; nothing runs during a capture, on either). Uploads are refused
during a capture (CUDA refuses synchronous copies there too); downloads become an asynchronous
copy into a pinned host buffer that the graph fills on every replay.

Both kinds count what the host asks of the device in one `DeviceCounters` (`counters`), at this
seam, so that the simulator's figures are a GPU's: operations launched (or captured), graph
replays, host synchronizations, and the bytes copied each way. Tests assert a decode step's
budget with them; benchmarks/bench_cuda_host.py prints them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections import Counter

import numpy as np

from .device import SIMULATED
from .sim_array import SimDeviceArray, raw

GIB = 1 << 30
SIMULATED_DEVICE_BYTES = 4 * GIB  # a simulated device's memory unless the probe says otherwise


class DeviceOutOfMemory(MemoryError):
    """A device allocation failed: `device`, the bytes asked for and the bytes free."""

    def __init__(self, device: int, need: int, free: int | None = None):
        self.device, self.need, self.free = device, int(need), free
        free_text = "" if free is None else f", {free / 2**20:.0f} MiB free"
        super().__init__(f"out of memory on GPU {device}: {need / 2**20:.0f} MiB asked for"
                         f"{free_text}")


class CaptureError(RuntimeError):
    """An operation a CUDA graph cannot hold was asked for during a capture."""


@dataclasses.dataclass
class DeviceCounters:
    """What the host asked of one device since the last `reset` (whoever measures a step resets
    before it and reads after it; `take` does both):

    - launches: operations enqueued from the host outside a capture, each a kernel launch, an
      array operation (CuPy's; numpy's under the simulator), a GEMM or a memset (`zeros`);
    - captured: operations recorded into a CUDA graph instead (they run on its replays);
    - graph_replays: captured graphs launched;
    - syncs: host waits for the device: `synchronize`, each download outside a capture (it
      returns the values, so it waits for them), and a peer copy's wait on its source;
    - h2d / d2h / peer: copies and bytes host to device, device to host (a replayed graph's
      downloads counted on every replay), device to device (counted on the receiving device).

    Not counted: a copy from pageable host memory may block the host as well (CUDA makes
    cudaMemcpyAsync from pageable memory synchronous with respect to the host); uploads are
    counted as copies only."""

    launches: int = 0
    captured: int = 0
    graph_replays: int = 0
    syncs: int = 0
    h2d_copies: int = 0
    h2d_bytes: int = 0
    d2h_copies: int = 0
    d2h_bytes: int = 0
    peer_copies: int = 0
    peer_bytes: int = 0

    def reset(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, 0)

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def take(self) -> dict[str, int]:
        """The figures since the last reset, then a reset: one step's when called per step."""
        figures = self.as_dict()
        self.reset()
        return figures


class CapturedGraph:
    """A captured decode step: `replay()` runs it again (DeviceRuntime.replay counts and calls
    it); it keeps the device buffers its nodes use (`keep`) and the pinned host buffers it fills
    (`outputs`) for as long as it lives."""

    def __init__(self, replay, keep, outputs):
        self.replay, self.keep, self.outputs = replay, keep, outputs
        self.d2h_bytes = sum(int(o.nbytes) for o in outputs)  # what each replay downloads
        self.n_ops = 0  # operations captured


def _replay_ops(ops):
    def replay():
        for fn, args, kwargs in ops:
            fn(*args, **kwargs)
    return replay


class DeviceRuntime:
    """One device's memory, stream and operations (see the module docstring)."""

    simulated = False

    def __init__(self, index: int):
        self.index = int(index)
        self.transfers: Counter = Counter()  # "upload", "download", "peer": copies made
        self.counters = DeviceCounters()
        self.capturing = False
        self._captured_ops = 0  # counters.captured when the capture began
        self._keep: list = []  # arrays a capture's graph refers to
        self._outputs: list = []  # pinned host buffers a capture's downloads fill

    xp = np
    kernel_stream = 0

    # the interface: counted here, the same for every kind of device, and done by the
    # underscored methods each kind implements below

    def owns(self, x) -> bool:
        """Whether `x` is an array on this device."""
        raise NotImplementedError

    def empty(self, shape, dtype):
        raise NotImplementedError

    def zeros(self, shape, dtype):
        self._count_op()  # a memset on a GPU
        return self._zeros(shape, dtype)

    def upload(self, host: np.ndarray):
        self._check_not_capturing("an upload")
        host = np.ascontiguousarray(host)
        self._count_upload(host.nbytes)
        return self._upload(host)

    def upload_into(self, dst, host: np.ndarray) -> None:
        self._check_not_capturing("an upload")
        self._count_upload(np.size(host) * np.dtype(dst.dtype).itemsize)
        self._upload_into(dst, host)

    def download(self, x) -> np.ndarray:
        """x on the host: now (a synchronization), or during a capture a pinned buffer that each
        replay of the graph fills."""
        self.transfers["download"] += 1
        if self.capturing:
            out = self._download_captured(x)
            self._outputs.append(out)
            return out
        c = self.counters
        c.syncs, c.d2h_copies, c.d2h_bytes = c.syncs + 1, c.d2h_copies + 1, c.d2h_bytes + x.nbytes
        return self._download(x)

    def copy_from(self, x, source: DeviceRuntime):
        """An array of another device, copied here once the source's stream has written it."""
        self._check_not_capturing("a copy between devices")
        source.synchronize()
        self.transfers["peer"] += 1
        self.counters.peer_copies += 1
        self.counters.peer_bytes += int(x.nbytes)
        return self._copy_from(x, source)

    def op(self, fn, *args, **kwargs) -> None:
        """fn(*args, **kwargs) on this device's stream: run now, or recorded during a capture."""
        self._count_op()
        self._op(fn, args, kwargs)

    def gemm(self, x, w, out) -> None:
        """out = x @ w.T as an operation: x (n, k), w (m, k), both float16 or both float32,
        out float32 (n, m)."""
        raise NotImplementedError

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the device (cudaMemGetInfo)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        self.counters.syncs += 1
        self._synchronize()

    def begin_capture(self) -> None:
        self._captured_ops = self.counters.captured
        self._begin_capture()

    def end_capture(self) -> CapturedGraph:
        """The captured graph; raises when the capture failed."""
        graph = self._end_capture()
        graph.n_ops = self.counters.captured - self._captured_ops
        return graph

    def replay(self, graph: CapturedGraph) -> None:
        """Launches a captured graph (asynchronously on a GPU: synchronize before reading its
        outputs)."""
        c = self.counters
        c.graph_replays += 1
        c.d2h_copies += len(graph.outputs)
        c.d2h_bytes += graph.d2h_bytes
        graph.replay()

    def _count_op(self) -> None:
        if self.capturing:
            self.counters.captured += 1
        else:
            self.counters.launches += 1

    def _count_upload(self, nbytes) -> None:
        self.transfers["upload"] += 1
        self.counters.h2d_copies += 1
        self.counters.h2d_bytes += int(nbytes)

    def captured_output(self, out) -> bool:
        """Whether `out` is a host buffer the last capture's graph fills."""
        return any(out is o for o in self._outputs)

    def free_memory(self) -> None:
        """Returns cached, unused device memory to the driver."""

    def _check_not_capturing(self, what: str) -> None:
        if self.capturing:
            raise CaptureError(f"{what} during a CUDA graph capture")


class SimulatedRuntime(DeviceRuntime):
    """A device of numba's CUDA simulator: numpy memory, counted against `total_bytes`."""

    simulated = True

    def __init__(self, index: int, total_bytes: int = SIMULATED_DEVICE_BYTES):
        super().__init__(index)
        self.total_bytes = int(total_bytes)
        self._used = [0]  # a list: the finalizers of freed arrays update it
        self._ops: list | None = None

    def owns(self, x) -> bool:
        return isinstance(x, SimDeviceArray) and x.device == self.index

    def _alloc(self, shape, dtype, fill=None):
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if self._used[0] + nbytes > self.total_bytes:
            raise DeviceOutOfMemory(self.index, nbytes, self.total_bytes - self._used[0])
        memory = np.empty(shape, dtype) if fill is None else np.zeros(shape, dtype)
        self._used[0] += nbytes
        used = self._used

        def release(n=nbytes):
            used[0] -= n
        weakref.finalize(memory, release)  # (views of it keep it alive)
        a = SimDeviceArray(memory, self.index)
        if self.capturing:
            self._keep.append(a)
        return a

    def empty(self, shape, dtype):
        return self._alloc(shape, dtype)

    def _zeros(self, shape, dtype):
        return self._alloc(shape, dtype, fill=0)

    def _upload(self, host):
        a = self._alloc(host.shape, host.dtype)
        raw(a)[...] = host
        return a

    def _upload_into(self, dst, host):
        np.copyto(raw(dst), host, casting="same_kind")

    def _download_captured(self, x):
        out = np.empty(x.shape, x.dtype)
        self._ops.append((np.copyto, (out, raw(x)), {}))
        return out

    def _download(self, x):
        return np.array(raw(x))

    def _copy_from(self, x, source):
        a = self._alloc(x.shape, x.dtype)
        raw(a)[...] = raw(x)
        return a

    def _op(self, fn, args, kwargs):
        """fn on the arrays' memory (the device's view of them): array operations and kernel
        launches; device arrays inside other arguments (a DeviceKV's rows) reach the simulator's
        kernels as they are."""
        args, kwargs = raw(args), raw(kwargs)
        if self._ops is not None:
            self._ops.append((fn, args, kwargs))
        else:
            fn(*args, **kwargs)

    def gemm(self, x, w, out):
        def product(x, w, out):
            np.matmul(x.astype(np.float32), w.astype(np.float32).T, out=out)
        self.op(product, x, w, out)

    def mem_info(self):
        return self.total_bytes - self._used[0], self.total_bytes

    def _synchronize(self):
        pass

    def _begin_capture(self):
        self.capturing, self._ops, self._keep, self._outputs = True, [], [], []

    def _end_capture(self):
        graph = CapturedGraph(_replay_ops(self._ops), self._keep, self._outputs)
        self.capturing, self._ops, self._keep = False, None, []
        return graph


# ----------------------------------------------------------------------------- a real GPU


def _allow_unsynchronized_interface() -> None:
    """numba synchronizes the stream a CUDA-array-interface object names on every kernel launch
    (NUMBA_CUDA_ARRAY_INTERFACE_SYNC); every array here is used on the stream it was made on,
    and a synchronization would both stall each launch and break graph capture."""
    import os

    from numba.core import config
    os.environ["NUMBA_CUDA_ARRAY_INTERFACE_SYNC"] = "0"  # numba re-reads its settings from it
    config.CUDA_ARRAY_INTERFACE_SYNC = False
    try:  # numba-cuda's own copy of the setting, where it has one
        from numba.cuda.core import config as cuda_config
        cuda_config.CUDA_ARRAY_INTERFACE_SYNC = False
    except ImportError:
        pass


class CupyRuntime(DeviceRuntime):
    """A GPU through CuPy (memory, copies, cuBLAS, graphs) and numba (kernel launches)."""

    def __init__(self, index: int):
        super().__init__(index)
        import cupy
        from numba import cuda
        _allow_unsynchronized_interface()
        self._cupy = cupy
        self.xp = cupy
        self._device = cupy.cuda.Device(self.index)
        self._numba_device = cuda.gpus[self.index]
        with self._device:
            self._stream = cupy.cuda.Stream(non_blocking=True)
        with self._numba_device:
            self.kernel_stream = cuda.external_stream(self._stream.ptr)
        self._one = np.ones(1, np.float32)
        self._zero = np.zeros(1, np.float32)
        self._gemm_ex = True  # cublasGemmEx works here (until it fails once)
        self._oom = cupy.cuda.memory.OutOfMemoryError

    @contextlib.contextmanager
    def _active(self):
        """This device current for CuPy and numba, this stream current for CuPy."""
        try:
            if self.index:
                with self._device, self._numba_device, self._stream:
                    yield
            else:
                with self._stream:
                    yield
        except self._oom as e:
            raise DeviceOutOfMemory(self.index, getattr(e, "size", 0) or 0) from None

    def owns(self, x) -> bool:
        return isinstance(x, self._cupy.ndarray) and x.device.id == self.index

    def _track(self, a):
        if self.capturing:
            self._keep.append(a)
        return a

    def empty(self, shape, dtype):
        with self._active():
            return self._track(self._cupy.empty(shape, dtype))

    def _zeros(self, shape, dtype):
        with self._active():
            a = self._cupy.empty(shape, dtype)
            a.fill(0)
            return self._track(a)

    def _upload(self, host):
        with self._active():
            a = self._cupy.empty(host.shape, host.dtype)
            a.set(host, stream=self._stream)
        return a

    def _upload_into(self, dst, host):
        with self._active():
            dst.set(np.ascontiguousarray(host, dtype=dst.dtype), stream=self._stream)

    def _download_captured(self, x):
        # an asynchronous copy into pinned memory is what a graph can hold
        import cupyx
        cupy = self._cupy
        out = cupyx.empty_pinned(x.shape, x.dtype)
        with self._active():
            x = self._track(cupy.ascontiguousarray(x))
            cupy.cuda.runtime.memcpyAsync(out.ctypes.data, x.data.ptr, x.nbytes,
                                          cupy.cuda.runtime.memcpyDeviceToHost, self._stream.ptr)
        return out

    def _download(self, x):
        with self._active():
            out = x.get(stream=self._stream)
        self._stream.synchronize()
        return out

    def _copy_from(self, x, source):
        x = self._cupy.ascontiguousarray(x)
        with self._active():
            a = self._cupy.empty(x.shape, x.dtype)
            self._cupy.cuda.runtime.memcpyPeerAsync(a.data.ptr, self.index, x.data.ptr,
                                                    source.index, x.nbytes, self._stream.ptr)
        return a

    def _op(self, fn, args, kwargs):
        with self._active():
            fn(*args, **kwargs)

    def gemm(self, x, w, out):
        self.op(self._gemm, x, w, out)

    def _gemm(self, x, w, out):
        cupy = self._cupy
        if x.dtype == np.float32 or not self._gemm_ex:
            cupy.matmul(x.astype(np.float32, copy=False), w.astype(np.float32, copy=False).T,
                        out=out)
            return
        try:
            self._gemm_f16(x, w, out)
        except Exception:  # noqa: BLE001 -- an old CuPy or cuBLAS: float32 GEMM from now on
            self._gemm_ex = False
            self._gemm(x, w, out)

    def _gemm_f16(self, x, w, out):
        """out (n, m) = x (n, k) · w (m, k)ᵀ, fp16 inputs, float32 accumulation and output: in
        cuBLAS's column-major terms outᵀ = wᵀᵀ · xᵀ, i.e. gemm(T, N) on the row-major buffers."""
        cupy = self._cupy
        try:
            from cupy_backends.cuda.libs import cublas
        except ImportError:
            from cupy.cuda import cublas
        runtime = cupy.cuda.runtime
        n, k = x.shape
        m = w.shape[0]
        handle = cupy.cuda.device.get_cublas_handle()
        cublas.setStream(handle, self._stream.ptr)
        cublas.setPointerMode(handle, getattr(cublas, "CUBLAS_POINTER_MODE_HOST", 0))
        cublas.gemmEx(handle, getattr(cublas, "CUBLAS_OP_T", 1), getattr(cublas, "CUBLAS_OP_N", 0),
                      m, n, k, self._one.ctypes.data, w.data.ptr, runtime.CUDA_R_16F, k,
                      x.data.ptr, runtime.CUDA_R_16F, k, self._zero.ctypes.data, out.data.ptr,
                      runtime.CUDA_R_32F, m, getattr(cublas, "CUBLAS_COMPUTE_32F", 68),
                      getattr(cublas, "CUBLAS_GEMM_DEFAULT", -1))

    def mem_info(self):
        with self._device:
            free, total = self._cupy.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def _synchronize(self):
        self._stream.synchronize()

    def _begin_capture(self):
        self._keep, self._outputs = [], []
        with self._active():
            self._stream.begin_capture()
        self.capturing = True

    def _end_capture(self):
        self.capturing = False
        keep, self._keep = self._keep, []
        with self._device:
            graph = self._stream.end_capture()

        def replay():
            with self._device:
                graph.launch(stream=self._stream)
        return CapturedGraph(replay, keep, self._outputs)

    def free_memory(self):
        with self._device:
            self._cupy.get_default_memory_pool().free_all_blocks()


def make_runtime(index: int, total_bytes: int | None = None) -> DeviceRuntime:
    """The runtime of device `index`: a GPU's, or under NUMBA_ENABLE_CUDASIM=1 a simulated one
    of `total_bytes`."""
    if SIMULATED:
        return SimulatedRuntime(index, total_bytes or SIMULATED_DEVICE_BYTES)
    return CupyRuntime(index)


def array_device(x) -> int | None:
    """The device index of a device array, None for a host array."""
    if isinstance(x, SimDeviceArray):
        return x.device
    if isinstance(x, np.ndarray):
        return None
    device = getattr(x, "device", None)
    return getattr(device, "id", None)
