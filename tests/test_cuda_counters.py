"""What the device runtime counts (runtime.DeviceCounters): each call of the seam once, in the
same way for every kind of device, since the counting lives in DeviceRuntime and the devices
only implement the underscored methods. A simulated device's runtime here, in the test process
(it needs numba's simulator only to launch kernels; these operations are numpy functions).
The budget of whole decode steps is checked under the simulator (cuda_backend_checks.py's
decode_step_budget)."""
import numpy as np
import pytest
from llamatui.inference.cuda.runtime import CaptureError, SimulatedRuntime
from llamatui.inference.cuda.sim_array import raw


def test_copies_count_their_bytes_and_a_download_is_a_synchronization():
    rt = SimulatedRuntime(0)
    x = rt.upload(np.arange(6, dtype=np.float32))
    rt.upload_into(x[:4], np.ones(4, np.int64))  # counted as the device's dtype receives it
    assert np.array_equal(rt.download(x), [1, 1, 1, 1, 4, 5])
    assert rt.counters.take() == {"launches": 0, "captured": 0, "graph_replays": 0, "syncs": 1,
                                  "h2d_copies": 2, "h2d_bytes": 24 + 16, "d2h_copies": 1,
                                  "d2h_bytes": 24, "peer_copies": 0, "peer_bytes": 0}
    assert rt.counters.as_dict() == dict.fromkeys(rt.counters.as_dict(), 0)  # take resets


def test_operations_memsets_and_synchronizations():
    rt = SimulatedRuntime(0)
    a, b = rt.zeros(3, np.float32), rt.empty(3, np.float32)  # a memset, an allocation
    rt.op(np.add, a, np.float32(2), out=b)
    rt.gemm(rt.zeros((1, 2), np.float32), rt.zeros((3, 2), np.float32), rt.empty((1, 3),
                                                                                 np.float32))
    rt.synchronize()
    c = rt.counters
    assert (c.launches, c.syncs, c.h2d_copies, c.d2h_copies) == (5, 1, 0, 0)
    assert np.array_equal(raw(b), [2, 2, 2])


def test_a_peer_copy_waits_for_its_source_and_counts_on_the_receiver():
    source, dest = SimulatedRuntime(0), SimulatedRuntime(1)
    x = source.upload(np.zeros((2, 5), np.float32))
    source.counters.reset()
    dest.copy_from(x, source)
    assert (source.counters.syncs, source.counters.peer_copies) == (1, 0)
    assert (dest.counters.peer_copies, dest.counters.peer_bytes, dest.counters.syncs) == (1, 40, 0)


def test_a_graph_launches_nothing_until_replayed_and_each_replay_downloads_again():
    rt = SimulatedRuntime(0)
    x = rt.upload(np.ones(4, np.float32))
    rt.counters.reset()
    rt.begin_capture()
    with pytest.raises(CaptureError):
        rt.upload(np.ones(1, np.float32))
    rt.op(np.multiply, x, np.float32(3), out=x)
    rt.op(np.add, x, np.float32(1), out=x)
    out = rt.download(x)
    graph = rt.end_capture()
    c = rt.counters
    assert (c.launches, c.captured, c.syncs, c.d2h_bytes, graph.n_ops) == (0, 2, 0, 0, 2)
    assert np.array_equal(raw(x), [1, 1, 1, 1])  # recorded, not run
    for _ in range(2):
        rt.replay(graph)
    rt.synchronize()
    assert np.array_equal(out, [13, 13, 13, 13])
    assert (c.launches, c.graph_replays, c.syncs, c.d2h_copies, c.d2h_bytes) == (0, 2, 1, 2, 32)
