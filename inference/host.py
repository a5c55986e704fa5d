"""What this machine's CPU can do, as LLVM names its target features. Device-neutral: the CPU
kernels pick their paths by it, and the number formats their conversions."""


def host_has(feature: str) -> bool:
    """Whether this CPU has an LLVM target feature ("f16c", "avx512bf16", ...)."""
    import llvmlite.binding as llvm
    return f"+{feature}" in llvm.get_host_cpu_features().flatten().split(",")
