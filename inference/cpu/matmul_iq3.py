"""(being written) the iq3 family's CPU kernels; registers against the type classes in inference/quants."""
