"""The arrays of a simulated device (runtime.SimulatedRuntime), as strict at the host boundary as
CuPy's, so that CI catches without a GPU the host code that a GPU would refuse.

A CuPy array cannot become a numpy array implicitly: `np.asarray(x)` (what a CPU backend does
with an activation it is handed) raises "TypeError: Implicit conversion to a NumPy array is not
allowed", and numpy math mixing it with a host array raises too. A numpy subclass does neither:
numpy converts it silently, so a device array reaching host code passed under the simulator and
failed on the first GPU. `SimDeviceArray` keeps its numpy memory to itself and behaves as CuPy's
arrays do where host code meets them:

- `__array__` raises TypeError, so np.asarray, np.array and np.ascontiguousarray refuse it;
- numpy functions and ufuncs on device arrays compute on the device and give device arrays (as
  CuPy's `__array_function__` / `__array_ufunc__` do), but refuse a host array among them;
- indexing, reshapes and views give device arrays; assigning host values into one is an upload,
  which CuPy allows;
- its memory reaches the host only through the runtime (`download`), which, like the runtime's
  operations and kernel launches, works on `raw(x)`.
"""
from __future__ import annotations

import numpy as np

IMPLICIT = ("Implicit conversion to a NumPy array is not allowed (a simulated device array, as "
            "strict as CuPy's): bring it to the host through its backend's to_host")


def raw(x):
    """The numpy memory of a device array (in lists, tuples and dicts too); anything else as is."""
    if type(x) is SimDeviceArray:
        return x._a
    if type(x) in (list, tuple):
        return type(x)(raw(v) for v in x)
    if type(x) is dict:
        return {k: raw(v) for k, v in x.items()}
    return x


def _refuse_host_arrays(values) -> None:
    for v in values:
        if type(v) in (list, tuple):
            _refuse_host_arrays(v)
        elif isinstance(v, np.ndarray) and v.ndim:
            raise TypeError(f"Unsupported type {type(v)}: a host array in device math (CuPy "
                            f"refuses it too)")


class SimDeviceArray:
    """An array on simulated device `device` (see the module docstring)."""

    __slots__ = ("_a", "device", "__weakref__")
    __hash__ = None  # as CuPy's: comparisons are elementwise

    def __init__(self, a: np.ndarray, device: int):
        self._a, self.device = a, device

    def _wrap(self, r):
        return SimDeviceArray(r, self.device) if isinstance(r, np.ndarray) else r

    def __repr__(self):
        return f"SimDeviceArray(device {self.device}, {self.dtype} {self.shape})"

    def __array__(self, dtype=None, copy=None):
        raise TypeError(IMPLICIT)

    # what describes an array
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    T = property(lambda self: self._wrap(self._a.T))

    def __len__(self):
        return len(self._a)

    # views and copies stay on the device
    def __getitem__(self, key):
        return self._wrap(self._a[raw(key)])

    def __setitem__(self, key, value):
        self._a[raw(key)] = raw(value)

    def reshape(self, *shape, **kwargs):
        return self._wrap(self._a.reshape(*shape, **kwargs))

    def view(self, dtype):
        return self._wrap(self._a.view(dtype))

    def astype(self, dtype, copy=True):
        return self._wrap(self._a.astype(dtype, copy=copy))

    def transpose(self, *axes):
        return self._wrap(self._a.transpose(*axes))

    def copy(self):
        return self._wrap(self._a.copy())

    def fill(self, value):
        self._a.fill(value)

    # math: on the device, never with host arrays
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _refuse_host_arrays(inputs)
        out = kwargs.get("out")
        result = getattr(ufunc, method)(*raw(inputs), **raw(kwargs))
        if out is not None:
            return out[0] if len(out) == 1 else out
        if isinstance(result, tuple):
            return tuple(self._wrap(np.asarray(r)) for r in result)
        return self._wrap(np.asarray(result))  # a reduction's scalar: a 0-d device array

    def __array_function__(self, func, types, args, kwargs):
        _refuse_host_arrays(args)
        result = func(*raw(args), **raw(kwargs))
        if kwargs.get("out") is not None:
            return kwargs["out"]
        return self._wrap(result)

    # a one-value array to a Python number: a synchronizing copy CuPy allows
    def __bool__(self):
        return bool(self._a)

    def __float__(self):
        return float(self._a)

    def __int__(self):
        return int(self._a)


def _reduction(name):
    def reduce(self, *args, **kwargs):
        return self._wrap(np.asarray(getattr(self._a, name)(*args, **kwargs)))
    reduce.__name__ = name
    return reduce


def _binary(ufunc, reflected=False, in_place=False):
    if in_place:
        return lambda self, other: ufunc(self, other, out=(self,))
    if reflected:
        return lambda self, other: ufunc(other, self)
    return lambda self, other: ufunc(self, other)


for _name, _ufunc in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                      ("truediv", np.true_divide), ("floordiv", np.floor_divide),
                      ("mod", np.remainder), ("pow", np.power), ("and", np.bitwise_and),
                      ("or", np.bitwise_or), ("xor", np.bitwise_xor), ("matmul", np.matmul)):
    setattr(SimDeviceArray, f"__{_name}__", _binary(_ufunc))
    setattr(SimDeviceArray, f"__r{_name}__", _binary(_ufunc, reflected=True))
    setattr(SimDeviceArray, f"__i{_name}__", _binary(_ufunc, in_place=True))
for _name, _ufunc in (("lt", np.less), ("le", np.less_equal), ("gt", np.greater),
                      ("ge", np.greater_equal), ("eq", np.equal), ("ne", np.not_equal)):
    setattr(SimDeviceArray, f"__{_name}__", _binary(_ufunc))
for _name, _ufunc in (("neg", np.negative), ("abs", np.absolute), ("invert", np.invert)):
    setattr(SimDeviceArray, f"__{_name}__", lambda self, _u=_ufunc: _u(self))
for _name in ("max", "min", "sum", "mean", "any", "all", "argmax"):  # reductions: 0-d or smaller
    setattr(SimDeviceArray, _name, _reduction(_name))
del _name, _ufunc
