"""Neural-network ops: convolution, pooling, LRN, batch norm, softmax, dropout, embedding."""
from __future__ import annotations
