"""(being written) the mxfp4 family's CPU kernels; registers against the type classes in inference/quants."""
