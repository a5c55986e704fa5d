"""IQ3_XXS, IQ3_S, IQ1_S and IQ1_M row quantizers on rows the golden vectors do not reach, against
the bytes llama.cpp 11434's ggml_quantize_chunk wrote for them (with the importance matrix below):

- zero_sub_block: an all-zero sub-block inside a block. IQ3_S's packing then does not advance, so
  the later sub-blocks' grid and sign bytes land early (ggml's quirk, which the files keep);
  IQ1_M skips the sub-block with its shift reset.
- ties: values from a small set, so the sort of IQ1's split search meets many ties (glibc's qsort
  is a merge sort at these sizes: stable).
"""
import numpy as np
import pytest

from llamatui.inference.quants import quantize

I = np.arange(256)
ROWS = {
    "zero_sub_block": np.where(I // 32 == 2, 0.0, np.sin(0.37 * I) * (1 + I % 7)),
    "ties": np.round(3 * np.sin(0.91 * I)) - 0.5 * (I % 3 == 0),
}
IMATRIX = (1 + I % 5).astype(np.float32)
GGML = {
    ("zero_sub_block", "IQ3_XXS"): (
        "e924942b9415946c8c9c3fd742fb05ff106000000000000000000b636c3f9c1ed20bfa05fa785aa13ac0"
        "3be861343d71139b1e9c2b9c159c6c9a780ca004d702d70080ff80ff03fe03ae000000003fe01fc07fc0"
        "7fb0fc01ffc1f007fcf7c01ff0ef"),
    ("zero_sub_block", "IQ3_S"): (
        "8d24715ca38c6fe8657c0db410fc04fe1e61daca2ace7c35b37cf9dff9e9b0486fb96fb96d62728a07dc"
        "43715cab18abdfce341b7e73b403fc050000000000000000d52a0054a502aa5500fe01fc03f807f03f80"
        "7f00ff00fe01fc03f807f00fe01fc03f807f00000000ccc0fcec"),
    ("zero_sub_block", "IQ1_S"): (
        "fc35935fc32ff526f59700000000cd935b9307200bf50e8969f76b2440a4f55957badde3c7e50000eeea"
        "216ee8fc78fe1a6d"),
    ("zero_sub_block", "IQ1_M"): (
        "905fc71de426f59700000000cd937558bb200bf50e89cfb86b246ba4575957e6b587872f0000de324b70"
        "5878f8f0b4b45e5f406ba767fd3c"),
    ("ties", "IQ3_XXS"): (
        "52206032b3b6d4e9d85071b0cbe9ac398392e4e6ea862eccddd4d960322299e4fdc0398392cabcc4862b"
        "b3dde6bf6059beddd4e9da3481b3f1f7da3987b9b6e6c4c5711eefd187611cef3ccf61d8613ccfd38773"
        "38fe3c8fe3d0c3389ec79ec330dc"),
    ("ties", "IQ3_S"): (
        "7120b3516ea7d2d68837f197c6d917c2aed7a7cf880a486ea7f7b71651276bd2fd5012496e9e79590aae"
        "9acbf74f18524be2acdc5062eed4e8a955b50b6ea7d94e557c1eeff37fdfc7fd71381c0f87e3f1383c0e"
        "87c3e1703c1c8fc7e170381c8e87e3f1381c1e87c3f1dfeedfee"),
    ("ties", "IQ1_S"): (
        "a7329c609976ad849c67a165607af66792de854c727551586e6c72f667c2656c842fda7981ec6e60f2ff"
        "0df66fe590fd1560"),
    ("ties", "IQ1_M"): (
        "9c609976ad849c67a1de607af66b92de854c72755ef66e6c72f667c26560842f3a4789eaf6013aff9d38"
        "46ada8ee1580be5df6cfb72dff3d"),
}


@pytest.mark.parametrize("case, type_name", list(GGML))
def test_matches_ggml_bytes(case, type_name):
    got = quantize(type_name, np.array([ROWS[case]], np.float32), IMATRIX)
    assert got[0].tobytes().hex() == "".join(GGML[case, type_name])
