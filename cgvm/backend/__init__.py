"""Backends: one array module each (NumPy on CPU, CuPy on GPU, the latter imported lazily)."""
from .base import Backend, available_backends, get_backend, host_array, scatter_add, scatter_reduce

__all__ = ["Backend", "get_backend", "available_backends", "host_array", "scatter_add", "scatter_reduce"]
