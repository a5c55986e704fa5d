"""(being written) the iq1 family's CUDA decoders (`@decoder(<type class>)`, see blocks.py)."""
