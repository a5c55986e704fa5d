"""(being written) the ternary family's CPU kernels; registers against the type classes in inference/quants."""
