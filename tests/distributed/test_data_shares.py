"""Each solver's share of a data layer: with 2 solvers, the layer built for rank r decodes only
records r, r+2, ... of every global batch, and the two shares interleaved are exactly the batch one
process of the double batch size reads (same records, shuffles, random crops and mirrors, over
several epochs). Decodes are counted where they happen (Datum parsing, image decoding, HDF5 rows)."""
import numpy as np
import pytest

from caffe_files import write_data
from cgvm.frontends.caffe import caffe_pb2, data_common, data_images, data_lmdb, data_shard
from cgvm.frontends.caffe.layers import DATA_LAYERS
from cgvm.frontends.caffe.prototxt import parse_net_text

pytest.importorskip("lmdb")
pytest.importorskip("h5py")
pytest.importorskip("PIL")

LAYERS = {
    "lmdb": 'type: "Data" transform_param {{ scale: 0.5 mirror: true crop_size: 5 }} '
            'data_param {{ source: "train_lmdb" batch_size: {batch} backend: LMDB }}',
    "hdf5": 'type: "HDF5Data" hdf5_data_param {{ source: "train_h5.txt" batch_size: {batch} shuffle: true }}',
    "images": 'type: "ImageData" transform_param {{ mirror: true crop_size: 4 mean_value: 3 }} '
              'image_data_param {{ source: "train_images.txt" batch_size: {batch} shuffle: true is_color: false }}',
    "window": 'type: "WindowData" transform_param {{ crop_size: 4 mirror: true }} '
              'window_data_param {{ source: "windows.txt" batch_size: {batch} fg_threshold: 0.5 bg_threshold: 0.5 '
              'fg_fraction: 0.25 context_pad: 1 }}',
}
GLOBAL_BATCH, STEPS = 16, 30   # 480 records of 192: the layers wrap (and reshuffle) twice


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("shares")
    write_data(d)
    lines = []
    for i in range(12):   # WindowData: 12 of the images, one foreground and one background window each
        lines += [f"# {i}", str(d / "img" / f"{i:04d}.png"), "1", "6", "6", "2", f"{1 + i % 3} 0.8 0 0 4 4",
                  "0 0.1 1 2 5 5"]
    (d / "windows.txt").write_text("\n".join(lines) + "\n")
    return d


@pytest.fixture
def counted(monkeypatch):
    """Counts of Datum records parsed and image files decoded, wherever a layer does it."""
    counts = {"datum": 0, "image": 0}

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(data_lmdb, "datum_to_array", counting("datum", data_lmdb.datum_to_array))
    monkeypatch.setattr(data_images, "_read_image", counting("image", data_images._read_image))
    yield counts
    data_shard.set_solver_count(1)
    data_shard.set_solver_rank(0)
    data_common.set_random_seed(None)


def _build(kind, batch, count, rank):
    """The TRAIN layer as the net builds it (the registered factory) with ``count`` solvers, seeded."""
    data_shard.set_solver_count(count)
    data_shard.set_solver_rank(rank)
    data_common.set_random_seed(11)
    text = 'layer { name: "d" top: "data" top: "label" ' + LAYERS[kind].format(batch=batch) + " }"
    layer = parse_net_text(text).layer[0]
    return DATA_LAYERS[layer.type](layer, caffe_pb2.TRAIN, None)


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_two_shares_decode_half_each_and_interleave_to_the_whole_batch(data, counted, monkeypatch, kind):
    monkeypatch.chdir(data)
    whole = _build(kind, GLOBAL_BATCH, 1, 0)
    shares = [_build(kind, GLOBAL_BATCH // 2, 2, r) for r in (0, 1)]
    for s in shares:
        assert s.batch_size == GLOBAL_BATCH   # built for the global batch, returning its share
        assert [shape[0] for shape in s.top_shapes()] == [GLOBAL_BATCH // 2] * 2
    counted.update(datum=0, image=0)
    decoded = {"whole": 0, 0: 0, 1: 0}
    for step in range(STEPS):
        before = dict(counted)
        batch = whole.next_batch()
        decoded["whole"] += sum(counted[k] - before[k] for k in counted)
        for r, s in enumerate(shares):
            before = dict(counted)
            part = s.next_batch()
            decoded[r] += sum(counted[k] - before[k] for k in counted)
            for top in ("data", "label"):
                assert part[top].shape[0] == GLOBAL_BATCH // 2
                np.testing.assert_array_equal(part[top], batch[top][r::2], err_msg=f"{kind} step {step} rank {r} "
                                                                                   f"{top}")
        if hasattr(whole, "get_state"):   # the read position moves over the whole batch on every rank
            assert shares[0].get_state() == shares[1].get_state() == whole.get_state()
    assert [s.records_decoded for s in shares] == [STEPS * GLOBAL_BATCH // 2] * 2
    assert whole.records_decoded == STEPS * GLOBAL_BATCH
    if kind in ("lmdb", "images"):   # counted outside the layer: each rank parses/decodes only its records
        assert decoded == {"whole": STEPS * GLOBAL_BATCH, 0: STEPS * GLOBAL_BATCH // 2, 1: STEPS * GLOBAL_BATCH // 2}
    if kind == "window":   # windows of one image share its decode within a batch: a share's images are a subset
        assert 0 < decoded[0] <= decoded["whole"] and 0 < decoded[1] <= decoded["whole"]


def test_test_phase_layers_are_not_split(data, counted, monkeypatch):
    monkeypatch.chdir(data)
    data_shard.set_solver_count(2)
    data_shard.set_solver_rank(1)
    layer = parse_net_text('layer { name: "d" top: "data" top: "label" '
                           + LAYERS["lmdb"].format(batch=8) + " }").layer[0]
    built = DATA_LAYERS["Data"](layer, caffe_pb2.TEST, None)
    assert built.positions is None and built.top_shapes()[0][0] == 8
