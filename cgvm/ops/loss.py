"""Loss ops: softmax cross-entropy, sigmoid cross-entropy, cross-entropies on probabilities, euclidean, hinge, contrastive."""
from __future__ import annotations
