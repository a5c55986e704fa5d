"""(being written) the mxfp4 family's CUDA decoders (`@decoder(<type class>)`, see blocks.py)."""
