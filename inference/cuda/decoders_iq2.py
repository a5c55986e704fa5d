"""(being written) the iq2 family's CUDA decoders (`@decoder(<type class>)`, see blocks.py)."""
