"""Model code: architecture description, weight loading, and the plain-torch transformer."""

from .arch import ModelArch
from .transformer import Transformer

__all__ = ["ModelArch", "Transformer"]
