"""(being written) the iq3 family's CUDA decoders (`@decoder(<type class>)`, see blocks.py)."""
