"""decode_image against pixels encoded losslessly (PNG, BMP), and tfidf_vectorize against counts
gathered n-gram by n-gram with NumPy."""
import io

import numpy as np
import pytest

from cgvm.errors import ExecutionError, GraphBuildError, ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import image as IM
from cgvm.ops import text as TX
from harness import Case, check_case, run_op

PIL = pytest.importorskip("PIL.Image")
rng = np.random.default_rng(8)
PIXELS = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
GRAY = np.repeat(rng.integers(0, 256, (4, 6, 1), dtype=np.uint8), 3, axis=2)   # R = G = B: "L" keeps the value


def encoded(pixels, fmt):
    with io.BytesIO() as f:
        PIL.fromarray(pixels).save(f, format=fmt)
        return np.frombuffer(f.getvalue(), np.uint8).copy()


CASES = [
    Case("decode_png_rgb", lambda d: IM.decode_image(d), [encoded(PIXELS, "PNG")], lambda d: PIXELS, grad=False),
    Case("decode_bmp_bgr", lambda d: IM.decode_image(d, pixel_format="BGR"), [encoded(PIXELS, "BMP")],
         lambda d: PIXELS[:, :, ::-1], grad=False),
    Case("decode_png_grayscale", lambda d: IM.decode_image(d, pixel_format="Grayscale"), [encoded(GRAY, "PNG")],
         lambda d: GRAY[:, :, :1], grad=False),
]


def ref_tfidf(x, pool, ngram_counts, ngram_indexes, min_gram_length, max_gram_length, max_skip_count, mode="TF",
              weights=None):
    """For each n-gram of the pool, the places it occurs with every allowed spacing (1-grams once)."""
    rows = np.atleast_2d(x)
    columns = max(ngram_indexes) + 1
    counts = np.zeros((rows.shape[0], columns))
    grams = []
    for i, start in enumerate(ngram_counts):
        stop = ngram_counts[i + 1] if i + 1 < len(ngram_counts) else len(pool)
        grams += [pool[k:k + i + 1] for k in range(start, stop, i + 1)]
    for k, gram in enumerate(grams):
        size = len(gram)
        if not min_gram_length <= size <= max_gram_length:
            continue
        spacings = [1] if size == 1 else range(1, max_skip_count + 2)
        for step in spacings:
            width = step * (size - 1) + 1
            for start in range(rows.shape[1] - width + 1):
                hit = np.all(rows[:, start:start + width:step] == np.asarray(gram), axis=1)
                counts[:, ngram_indexes[k]] += hit
    w = np.ones(columns)
    if weights:
        w = np.zeros(columns)
        for k, column in enumerate(ngram_indexes):
            w[column] = weights[k]
    out = counts if mode == "TF" else (counts > 0) * w if mode == "IDF" else counts * w
    return out.astype(np.float32).reshape(columns) if np.ndim(x) == 1 else out.astype(np.float32)


TOKENS = rng.integers(0, 6, (3, 14)).astype(np.int64)
POOL = dict(pool=[2, 3, 5, 4, 5, 6, 7, 8, 6, 7, 1, 2, 3], ngram_counts=[0, 4, 10],
            ngram_indexes=[7, 6, 5, 4, 3, 2, 1, 0])   # columns in reverse order


def tfidf_case(name, x, **attrs):
    merged = dict(POOL, **attrs)
    return Case(name, lambda v: TX.tfidf_vectorize(v, **merged), [x], lambda a: ref_tfidf(a, **merged), grad=False)


TFIDF_CASES = [
    tfidf_case("tf_uni_and_bigrams_skip2", TOKENS, min_gram_length=1, max_gram_length=2, max_skip_count=2),
    tfidf_case("tf_only_trigrams_skip1", TOKENS, min_gram_length=3, max_gram_length=3, max_skip_count=1),
    tfidf_case("idf_weighted_1d", TOKENS[0].astype(np.int32), min_gram_length=1, max_gram_length=3,
               max_skip_count=0, mode="IDF", weights=[0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4]),
    tfidf_case("tfidf_unweighted", TOKENS, min_gram_length=2, max_gram_length=3, max_skip_count=3, mode="TFIDF"),
]


@pytest.mark.parametrize("case", CASES + TFIDF_CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


def test_decode_image_refuses_what_is_not_an_image():
    with pytest.raises(ExecutionError, match="not an image"):
        run_op(lambda d: IM.decode_image(d), [np.frombuffer(b"not an image at all", np.uint8).copy()])
    with pytest.raises((ShapeError, GraphBuildError)):
        IM.decode_image(input_value(TensorType((4, 4), np.uint8), "d"))


def test_tfidf_checks_its_pool():
    x = input_value(TensorType((2, 5), np.int64), "x")
    with pytest.raises((ShapeError, GraphBuildError)):        # 3 tokens are not whole 2-grams
        TX.tfidf_vectorize(x, pool=[1, 2, 3, 4, 5], ngram_counts=[0, 2], ngram_indexes=[0, 1, 2],
                           min_gram_length=1, max_gram_length=2)
    with pytest.raises((ShapeError, GraphBuildError)):
        TX.tfidf_vectorize(input_value(TensorType((2, 5), np.float32), "f"), pool=[1], ngram_counts=[0],
                           ngram_indexes=[0], min_gram_length=1, max_gram_length=1)
