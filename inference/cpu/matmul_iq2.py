"""(being written) the iq2 family's CPU kernels; registers against the type classes in inference/quants."""
