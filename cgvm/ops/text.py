"""Counting n-grams of integer tokens: tfidf_vectorize (ONNX TfIdfVectorizer on integer inputs).

    tfidf_vectorize(x, pool=, ngram_counts=, ngram_indexes=, min_gram_length=, max_gram_length=,
                    max_skip_count=, mode="TF", weights=None) -> (rows, columns) float32

``x`` is one row (1-D) or rows (2-D) of integer tokens. ``pool`` lists the n-grams looked for, the
1-grams first, then the 2-grams, ...: ``ngram_counts[i]`` is where the (i+1)-grams start in it.
The n-grams are numbered in pool order; ``ngram_indexes[k]`` is the output column of n-gram k,
and there are ``max(ngram_indexes) + 1`` columns. An n-gram is counted wherever its tokens occur
``skip + 1`` apart for a skip in 0..max_skip_count (1-grams once, whatever the skip), if its length
is within [min_gram_length, max_gram_length]. ``mode``: "TF" the counts, "IDF" the weight (or 1)
of each n-gram present, "TFIDF" count x weight (or the count). Not differentiable: the result is
integer-valued in its input. Runs on the host.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from ..errors import ShapeError
from ..ir.attrs import Floats, Int, Ints, Str
from ..ir.types import TensorType
from .registry import OPAQUE, defop

MODES = ("TF", "IDF", "TFIDF")


def ngram_table(pool: Sequence[int], ngram_counts: Sequence[int], ngram_indexes: Sequence[int],
                min_gram_length: int, max_gram_length: int) -> Dict[Tuple[int, ...], int]:
    """{n-gram tokens: output column} of the pool's n-grams with a length in [min, max]."""
    table: Dict[Tuple[int, ...], int] = {}
    number = 0
    for i, start in enumerate(ngram_counts):
        size = i + 1
        stop = ngram_counts[i + 1] if i + 1 < len(ngram_counts) else len(pool)
        if stop < start or (stop - start) % size:
            raise ShapeError(f"tfidf_vectorize: the pool's {size}-grams (positions {start}..{stop}) are not a "
                             f"whole number of {size}-grams")
        for at in range(start, stop, size):
            if number >= len(ngram_indexes):
                raise ShapeError(f"tfidf_vectorize: the pool has more n-grams than ngram_indexes "
                                 f"({len(ngram_indexes)}) has columns for")
            if min_gram_length <= size <= max_gram_length:
                table.setdefault(tuple(int(t) for t in pool[at:at + size]), int(ngram_indexes[number]))
            number += 1
    return table


def _infer(types, pool, ngram_counts, ngram_indexes, min_gram_length, max_gram_length, max_skip_count, mode,
           weights):
    x = types[0]
    if not x.dtype.is_int or x.ndim not in (1, 2):
        raise ShapeError(f"tfidf_vectorize: the tokens must be a 1-D or 2-D integer tensor, got {x!r}")
    if not ngram_indexes or min(ngram_indexes) < 0:
        raise ShapeError("tfidf_vectorize: ngram_indexes must list a non-negative column per n-gram")
    if not 1 <= min_gram_length <= max_gram_length or max_skip_count < 0:
        raise ShapeError(f"tfidf_vectorize: gram lengths {min_gram_length}..{max_gram_length} and skip "
                         f"{max_skip_count} make no n-grams")
    if weights is not None and len(weights) not in (0, len(ngram_indexes)):
        raise ShapeError(f"tfidf_vectorize: {len(weights)} weights for {len(ngram_indexes)} n-grams")
    ngram_table(pool, ngram_counts, ngram_indexes, min_gram_length, max_gram_length)
    columns = max(ngram_indexes) + 1
    return TensorType((columns,) if x.ndim == 1 else (x.shape[0], columns), "float32")


tfidf_vectorize = defop(
    "tfidf_vectorize", num_inputs=1, pattern=OPAQUE, differentiable=False,
    attrs={"pool": Ints(), "ngram_counts": Ints(), "ngram_indexes": Ints(), "min_gram_length": Int(),
           "max_gram_length": Int(), "max_skip_count": Int(0), "mode": Str("TF", choices=MODES),
           "weights": Floats(None)},
    infer=_infer, doc="n-gram counts (TF), presence weights (IDF) or weighted counts (TFIDF) of integer tokens, "
                      "one row of columns per row of tokens (ONNX TfIdfVectorizer).")


def count_ngrams(rows: np.ndarray, table: Dict[Tuple[int, ...], int], columns: int, min_gram_length: int,
                 max_gram_length: int, max_skip_count: int) -> np.ndarray:
    counts = np.zeros((rows.shape[0], columns), np.int64)
    for r, row in enumerate(rows.tolist()):
        for skip in range(max_skip_count + 1):
            step = skip + 1
            # 1-grams do not depend on the skip: they are counted on the first pass only
            shortest = min_gram_length if skip == 0 else max(min_gram_length, 2)
            if shortest > max_gram_length:
                break
            for start in range(len(row)):
                for size in range(shortest, max_gram_length + 1):
                    if start + step * (size - 1) >= len(row):
                        break
                    column = table.get(tuple(row[start:start + step * (size - 1) + 1:step]))
                    if column is not None:
                        counts[r, column] += 1
    return counts


@tfidf_vectorize.kernel
def _(xp, x, *, pool, ngram_counts, ngram_indexes, min_gram_length, max_gram_length, max_skip_count, mode,
      weights, out=None):
    host = x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else np.asarray(x)
    table = ngram_table(pool, ngram_counts, ngram_indexes, min_gram_length, max_gram_length)
    columns = max(ngram_indexes) + 1
    counts = count_ngrams(host.reshape(-1, host.shape[-1]) if host.ndim == 2 else host[None], table, columns,
                          min_gram_length, max_gram_length, max_skip_count)
    result = _weigh(counts, mode, weights, ngram_indexes, columns).astype(np.float32)
    result = result.reshape((columns,) if host.ndim == 1 else (host.shape[0], columns))
    if out is None:
        return xp.asarray(result)
    out[...] = xp.asarray(result)
    return out


def _weigh(counts: np.ndarray, mode: str, weights: Optional[Sequence[float]], ngram_indexes: Sequence[int],
           columns: int) -> np.ndarray:
    if mode == "TF":
        return counts.astype(np.float64)
    # weights are given per n-gram (pool order) in ONNX's definition; they index output columns
    per_column = np.ones(columns)
    if weights:
        per_column = np.zeros(columns)
        for k, column in enumerate(ngram_indexes):
            per_column[column] = weights[k]
    if mode == "IDF":
        return (counts > 0) * per_column
    return counts * per_column
