"""(being written) the ternary family's CUDA decoders (`@decoder(<type class>)`, see blocks.py)."""
