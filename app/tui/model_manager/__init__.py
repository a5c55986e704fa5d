"""The model manager (F3): its screen (screen.py) and one module per tab."""
from .screen import MODELS_ACTIONS, ModelsScreen

__all__ = ["MODELS_ACTIONS", "ModelsScreen"]
