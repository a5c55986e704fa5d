"""Layer placement as llama.cpp's llama_model::load_tensors does it, on simulated devices."""
import pytest
from llamatui.inference import OffloadOptions
from llamatui.inference.placement import OffloadError, plan_offload

GIB = 1 << 30
N_LAYER = 10


def plan(n_gpu_layers, devices_free=(100 * GIB,), margin=0, layer_bytes=100, output_bytes=50,
         kv_bytes=10, **offload):
    """plan_offload for N_LAYER layers of these sizes; `offload`: OffloadOptions' other fields."""
    options = OffloadOptions(n_gpu_layers=n_gpu_layers, **offload)
    return plan_offload(N_LAYER, layer_bytes, output_bytes, kv_bytes, devices_free, options,
                        margin=margin)


def gpu_layers(p):
    return [il for il, d in enumerate(p.layer_device) if d is not None]


@pytest.mark.parametrize("ngl, layers, output", [
    (0, [], None),
    (1, [], 0),  # the output layer goes first
    (3, [8, 9], 0),  # then the last repeating layers
    (10, list(range(1, 10)), 0),
    (11, list(range(10)), 0),
    (99, list(range(10)), 0),
    (-1, list(range(10)), 0),
    ("all", list(range(10)), 0),
])
def test_ngl_offloads_the_output_then_the_last_layers(ngl, layers, output):
    p = plan(ngl)
    assert gpu_layers(p) == layers and p.output_device == output
    assert p.n_gpu_layers == len(layers) + (output is not None)
    assert p.kv_device == p.layer_device  # the KV cache follows its layer


def test_bytes_are_counted_per_device():
    p = plan(3)
    assert p.device_bytes == (2 * 100 + 2 * 10 + 50,)


def test_no_kv_offload_keeps_the_cache_on_the_cpu():
    p = plan("all", offload_kv=False)
    assert p.kv_device == (None,) * N_LAYER
    assert p.device_bytes == (N_LAYER * 100 + 50,)


def test_tensor_split_divides_the_layers_in_proportion():
    # 11 offloaded units (10 layers and the output); layer il goes to the first device whose
    # cumulative share exceeds il / 11
    p = plan("all", devices_free=(GIB, GIB), tensor_split=(1, 1))
    assert p.layer_device == (0,) * 6 + (1,) * 4 and p.output_device == 1
    p = plan("all", devices_free=(GIB, GIB), tensor_split=(3, 1))
    assert p.layer_device == (0,) * 9 + (1,) and p.output_device == 1
    p = plan("all", devices_free=(GIB, GIB), tensor_split=(0, 1))
    assert p.layer_device == (1,) * 10 and p.output_device == 1


def test_without_tensor_split_free_memory_sets_the_shares():
    p = plan("all", devices_free=(30 * GIB, 10 * GIB))
    assert p.layer_device == (0,) * 9 + (1,)
    p = plan("all", devices_free=(30 * GIB, 10 * GIB), tensor_split=(0, 0))  # all zero: default
    assert p.layer_device == (0,) * 9 + (1,)


def test_partial_offload_splits_only_the_offloaded_layers():
    p = plan(4, devices_free=(GIB, GIB), tensor_split=(1, 1))
    assert p.layer_device == (None,) * 7 + (0, 0, 1) and p.output_device == 1


def test_split_mode_none_puts_everything_on_the_main_gpu():
    p = plan("all", devices_free=(GIB, GIB, GIB), split_mode="none", main_gpu=2)
    assert set(p.layer_device) == {2} and p.output_device == 2
    assert p.device_bytes[:2] == (0, 0)


def test_auto_offloads_the_most_layers_that_fit_with_the_margin():
    # output 50 + k layers of 100 + 10 must stay within 600 - 100 margin: k = 4
    p = plan("auto", devices_free=(600,), margin=100)
    assert p.output_device == 0 and gpu_layers(p) == [6, 7, 8, 9] and p.n_gpu_layers == 5
    assert p.device_bytes[0] + 100 <= 600


def test_auto_across_two_devices_checks_each_one():
    p = plan("auto", devices_free=(2000, 300), tensor_split=(1, 1), margin=0)
    assert all(used <= free for used, free in zip(p.device_bytes, (2000, 300)))
    assert p.n_gpu_layers < N_LAYER + 1  # device 1 holds at most 2 layers' worth
    bigger = plan(p.n_gpu_layers + 1, devices_free=(2000, 300), tensor_split=(1, 1))
    assert any(used > free for used, free in zip(bigger.device_bytes, (2000, 300)))


def test_auto_with_nothing_fitting_stays_on_the_cpu():
    p = plan("auto", devices_free=(GIB,), margin=2 * GIB)
    assert p.n_gpu_layers == 0 and p.output_device is None and p.device_bytes == (0,)


def test_all_fits_everything_when_memory_allows():
    p = plan("auto", devices_free=(100 * GIB,), margin=GIB)
    assert p.n_gpu_layers == N_LAYER + 1


def test_no_devices_means_the_cpu_whatever_ngl_says():
    p = plan("all", devices_free=())
    assert p.n_gpu_layers == 0 and p.output_device is None and p.device_bytes == ()


def test_per_layer_sizes():
    p = plan("all", layer_bytes=[10 * i for i in range(N_LAYER)], kv_bytes=[1] * N_LAYER,
             output_bytes=5)
    assert p.device_bytes == (sum(10 * i for i in range(N_LAYER)) + N_LAYER + 5,)


def test_describe_summarizes_like_llama_cpp():
    p = plan(4, devices_free=(GIB, GIB), tensor_split=(1, 1))
    assert p.describe() == ("offloaded 4/11 layers to GPU (repeating layers GPU 0: 2, GPU 1: 1; "
                            "output layer on GPU 1)")


@pytest.mark.parametrize("kw, words", [
    ({"n_gpu_layers": "lots"}, "-ngl: 'lots'"),
    ({"main_gpu": 2}, "-mg: device 2 does not exist (2 device(s): 0..1)"),
    ({"tensor_split": (1, 1, 1)}, "-ts: expected 2 non-negative shares"),
    ({"tensor_split": (1, -1)}, "-ts: expected 2"),
    ({"split_mode": "row"}, "-sm: 'row'"),
    ({"layer_bytes": [1, 2]}, "layer_bytes: expected 10"),
])
def test_bad_options_are_refused_by_name(kw, words):
    kw = {"n_gpu_layers": "all", **kw}
    with pytest.raises(OffloadError, match=words.replace("(", r"\(").replace(")", r"\)")):
        plan(kw.pop("n_gpu_layers"), devices_free=(GIB, GIB), **kw)
    assert issubclass(OffloadError, ValueError)
