"""(being written) the iq1 family's CPU kernels; registers against the type classes in inference/quants."""
