"""Solver snapshots: writing and restoring Caffe's .solverstate (binary proto or HDF5) with the weights.

A restored run continues exactly as if training had not stopped: Caffe's state holds the
iteration, the learning-rate step and the history blobs (momentum and the like), and a small
JSON file beside it adds the random generators and data read positions that Caffe does not keep.
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Dict, List, Tuple

import numpy as np

from cgvm.backend import host_array
from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe import solver_updates as su
from cgvm.frontends.caffe import weights as _weights
from cgvm.frontends.caffe.errors import CaffeError, CaffeParseError
from cgvm.frontends.caffe.io import array_to_blobproto, blobproto_to_array
from cgvm.frontends.caffe.prototxt import read_solver_state, write_solver_state

if TYPE_CHECKING:
    from cgvm.frontends.caffe.solver import Solver

#: Beside each .solverstate: the random generators and data read positions (JSON), so a restored
#: run draws the same batches, crops and dropout masks as an uninterrupted one. Caffe ignores it.
RUN_STATE_SUFFIX = ".cgvm-run.json"


def snapshot_paths(solver: "Solver") -> Tuple[str, str]:
    """The (weights, solver state) paths a snapshot at the current iteration writes."""
    p = solver.param
    prefix = p.snapshot_prefix or (os.path.splitext(solver.solver_file)[0] if solver.solver_file else "snapshot")
    hdf5 = p.snapshot_format == caffe_pb2.SolverParameter.HDF5
    return (f"{prefix}_iter_{solver.iter}.caffemodel" + (".h5" if hdf5 else ""),
            f"{prefix}_iter_{solver.iter}.solverstate" + (".h5" if hdf5 else ""))


def _partial(path: str) -> str:
    """Where ``path`` is written before it is renamed into place: a killed process leaves no
    half-written snapshot under the real name (and the previous snapshot untouched)."""
    return f"{path}.partial-{os.getpid()}"


def write_snapshot(solver: "Solver") -> Tuple[str, str]:
    """Write ``<prefix>_iter_<N>.caffemodel`` and ``.solverstate`` (``.h5`` both for HDF5); their paths.

    Each file is written under a temporary name and renamed into place; the solver state, which
    a resume starts from, comes last, after the weights and the run state it names.
    """
    p = solver.param
    hdf5 = p.snapshot_format == caffe_pb2.SolverParameter.HDF5
    model, state = snapshot_paths(solver)
    kind = "HDF5 file" if hdf5 else "binary proto file"
    solver._log(f"Snapshotting to {kind} {model}")
    (_weights.save_hdf5 if hdf5 else _weights.save)(solver.net, _partial(model), write_diff=p.snapshot_diff)
    os.replace(_partial(model), model)
    with open(_partial(state + RUN_STATE_SUFFIX), "w") as f:
        json.dump(_run_state(solver), f)
    os.replace(_partial(state + RUN_STATE_SUFFIX), state + RUN_STATE_SUFFIX)
    solver._log(f"Snapshotting solver state to {kind} {state}")
    histories = _history_arrays(solver)
    if hdf5:
        import h5py

        with h5py.File(_partial(state), "w") as f:
            f.create_dataset("iter", data=np.int32(solver.iter))
            f.create_dataset("learned_net", data=model.encode())
            f.create_dataset("current_step", data=np.int32(solver.current_step))
            group = f.create_group("history")
            for i, array in enumerate(histories):
                group.create_dataset(str(i), data=array)
    else:
        msg = caffe_pb2.SolverState(iter=solver.iter, learned_net=model, current_step=solver.current_step)
        msg.history.extend(array_to_blobproto(a) for a in histories)
        write_solver_state(msg, _partial(state))
    os.replace(_partial(state), state)
    return model, state


def _run_state(solver: "Solver") -> Dict[str, Any]:
    """What Caffe's SolverState lacks for an exact resume: random generators and data positions."""
    nets = []
    for net in [solver.net] + solver.test_nets:
        layers = {info.name: info.data.get_state() for info in net.layer_infos
                  if info.data is not None and hasattr(info.data, "get_state")}
        nets.append({"rng": net._rng.bit_generator.state, "data": layers})
    return {"format": "cgvm-solver-run-state/1", "nets": nets}


def _set_run_state(solver: "Solver", state: Dict[str, Any]) -> None:
    for net, saved in zip([solver.net] + solver.test_nets, state.get("nets", [])):
        for info in net.layer_infos:
            if info.name in saved["data"] and hasattr(info.data, "set_state"):
                info.data.set_state(saved["data"][info.name])
        # last: reloading a data file may draw from the generator, which data layers share
        net._rng.bit_generator.state = saved["rng"]


def _check_run_state(solver: "Solver", state: Any, path: str) -> Dict[str, Any]:
    """The run-state JSON's structure checked before anything is applied (CaffeParseError naming the field)."""
    def bad(field: str, why: str) -> CaffeParseError:
        return CaffeParseError(f"{field}: {why}", filename=path,
                               hint="delete this file to resume without the random and data positions")

    if not isinstance(state, dict) or not isinstance(state.get("nets", []), list):
        raise bad("nets", "expected an object with a list of nets")
    nets = [solver.net] + solver.test_nets
    for i, saved in enumerate(state.get("nets", [])[:len(nets)]):
        if not isinstance(saved, dict) or not isinstance(saved.get("data"), dict) or "rng" not in saved:
            raise bad(f"nets[{i}]", "expected an object with 'rng' and 'data'")
        probe = type(nets[i]._rng.bit_generator)()
        try:
            probe.state = saved["rng"]
        except (TypeError, ValueError, KeyError, OverflowError) as exc:
            raise bad(f"nets[{i}].rng", f"not a {type(probe).__name__} state ({exc})") from exc
    return state


def _history_entries(solver: "Solver") -> List[Tuple[str, Tuple[int, ...]]]:
    """History entries in Caffe's order: every param's first history, then every param's second."""
    params = solver.net.learnable_params
    return [(solver._histories[p.name][k], p.shape) for k in range(su.HISTORY_COUNT[solver.type_name])
            for p in params]


def _history_arrays(solver: "Solver") -> List[np.ndarray]:
    return [host_array(solver.workspace[e]) for e, _ in _history_entries(solver)]


def restore(solver: "Solver", state_file: str) -> None:
    """Load a .solverstate (or .solverstate.h5): iteration, lr position, weights and histories.

    Everything is read and checked first (the state, the weights it names, the run-state JSON);
    the solver changes only when all of it fits, so a failed restore leaves it as it was.
    """
    if not os.path.exists(state_file):
        raise FileNotFoundError(f"Could not open file {state_file}")
    if os.path.isdir(state_file):
        raise CaffeParseError("this is a directory, not a solver state", filename=state_file)
    if state_file.endswith(".h5"):
        import h5py  # noqa: F401  (imported here once, not again in every guarded reader)

        from cgvm.env import max_bytes
        from cgvm.guard import call_with_deadline

        iteration, current_step, learned, histories = call_with_deadline(
            read_hdf5_state, state_file, max_bytes(), what=f"{state_file}: reading the HDF5 solver state",
            path=state_file)
    else:
        msg = read_solver_state(state_file)
        iteration, current_step, learned = msg.iter, msg.current_step, msg.learned_net
        if isinstance(learned, bytes):   # protobuf hands back bytes that are not UTF-8
            raise CaffeParseError(f"learned_net {learned[:80]!r} is not UTF-8 text", filename=state_file)
        histories = [blobproto_to_array(b) for b in msg.history]
    if iteration < 0 or current_step < 0:
        raise CaffeParseError(f"iter {iteration} / current_step {current_step}: negative", filename=state_file)
    entries = _history_entries(solver)
    if len(histories) != len(entries):
        raise CaffeError(f"{state_file}: the state holds {len(histories)} history blobs; this {solver.type_name} "
                         f"solver needs {len(entries)} (is it from another solver type or net?)")
    staged = []
    for index, ((entry, shape), array) in enumerate(zip(entries, histories)):
        if int(np.prod(array.shape)) != int(np.prod(shape)):
            raise CaffeError(f"{state_file}: history blob {index} (for {entry!r}) has shape {array.shape}, "
                             f"the net needs {shape}")
        staged.append((entry, np.asarray(array, solver._dtype()).reshape(shape)))
    weights: Dict[str, np.ndarray] = {}
    if learned:
        path = learned if os.path.exists(learned) else os.path.join(os.path.dirname(state_file),
                                                                     os.path.basename(learned))
        for part in _weights.stage_weights(solver.net, path).values():
            weights.update(part)
    run_state = None
    if os.path.isfile(state_file + RUN_STATE_SUFFIX):
        run_file = state_file + RUN_STATE_SUFFIX
        try:
            with open(run_file, "rb") as f:
                run_state = json.loads(f.read().decode("utf-8"))
        except (ValueError, RecursionError, UnicodeDecodeError) as exc:
            raise CaffeParseError(f"not JSON: {exc}", filename=run_file) from exc
        run_state = _check_run_state(solver, run_state, run_file)
    _commit(solver, weights, staged, iteration, current_step, run_state, state_file)


def _commit(solver: "Solver", weights, staged, iteration: int, current_step: int, run_state, state_file) -> None:
    """Swap the checked state in; a run state a data layer refuses puts everything back."""
    nets = [solver.net] + solver.test_nets
    before_data = [{info.name: info.data.get_state() for info in net.layer_infos
                    if info.data is not None and hasattr(info.data, "get_state")} for net in nets]
    before_rng = [net._rng.bit_generator.state for net in nets]
    if run_state is not None:
        try:
            _set_run_state(solver, run_state)
        except Exception as exc:   # a data position that does not fit this net: roll back
            for net, data, rng in zip(nets, before_data, before_rng):
                for info in net.layer_infos:
                    if info.name in data:
                        info.data.set_state(data[info.name])
                net._rng.bit_generator.state = rng
            raise CaffeParseError(f"the data positions do not fit this net: {type(exc).__name__}: {exc}",
                                  filename=state_file + RUN_STATE_SUFFIX) from exc
    _weights.commit_weights(solver.net, weights)
    for entry, array in staged:
        solver.workspace.set(entry, array)
    solver.iter, solver.current_step = iteration, current_step


def read_hdf5_state(path: str, limit: int) -> Tuple[int, int, str, List[np.ndarray]]:
    """(iter, current_step, learned_net, history arrays) of an HDF5 .solverstate (run in a guarded child).

    Every dataset's type and size is checked before it is read; CaffeParseError names the dataset.
    """
    import h5py

    where = "/"
    try:
        with h5py.File(path, "r") as f:
            def scalar(name: str, default: Any = None) -> int:
                if name not in f:
                    if default is None:
                        raise CaffeParseError(f"no /{name} dataset: not a Caffe HDF5 solver state", filename=path)
                    return default
                dataset = f[name]
                if not isinstance(dataset, h5py.Dataset) or dataset.dtype.kind not in "iu" or dataset.size != 1:
                    raise CaffeParseError(f"/{name} is not an integer scalar", filename=path)
                return int(np.asarray(dataset[()]).reshape(()))

            where = "/iter"
            iteration = scalar("iter")
            where = "/current_step"
            current_step = scalar("current_step", 0)
            where = "/learned_net"
            learned = ""
            if "learned_net" in f:
                dataset = f["learned_net"]
                if not isinstance(dataset, h5py.Dataset) or dataset.dtype.kind not in "SOU" or dataset.size != 1:
                    raise CaffeParseError("/learned_net is not a string", filename=path)
                raw = np.asarray(dataset[()]).reshape(()).item()
                learned = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
            where = "/history"
            histories: List[np.ndarray] = []
            group = f.get("history")
            if group is not None:
                if not isinstance(group, h5py.Group):
                    raise CaffeParseError("/history is not a group", filename=path)
                total = 0
                for i in range(len(group)):
                    where = f"/history/{i}"
                    history, total = _weights.read_numeric_dataset(group.get(str(i)), where, path, total, limit)
                    histories.append(history)
    except CaffeParseError:
        raise
    except Exception as exc:   # h5py's KeyError / OSError / RuntimeError / ValueError on a corrupt file
        raise CaffeParseError(f"cannot read the HDF5 solver state at {where}: {type(exc).__name__}: {exc}",
                              filename=path) from exc
    return iteration, current_step, learned, histories
