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
from cgvm.frontends.caffe.errors import CaffeError
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


def _history_entries(solver: "Solver") -> List[Tuple[str, Tuple[int, ...]]]:
    """History entries in Caffe's order: every param's first history, then every param's second."""
    params = solver.net.learnable_params
    return [(solver._histories[p.name][k], p.shape) for k in range(su.HISTORY_COUNT[solver.type_name])
            for p in params]


def _history_arrays(solver: "Solver") -> List[np.ndarray]:
    return [host_array(solver.workspace[e]) for e, _ in _history_entries(solver)]


def restore(solver: "Solver", state_file: str) -> None:
    """Load a .solverstate (or .solverstate.h5): iteration, lr position, weights and histories."""
    if not os.path.isfile(state_file):
        raise FileNotFoundError(f"Could not open file {state_file}")
    if state_file.endswith(".h5"):
        import h5py

        with h5py.File(state_file, "r") as f:
            iteration, current_step = int(f["iter"][()]), int(f["current_step"][()]) if "current_step" in f else 0
            learned = f["learned_net"][()] if "learned_net" in f else b""
            learned = learned.decode() if isinstance(learned, bytes) else str(learned)
            group = f.get("history")
            histories = [np.asarray(group[str(i)]) for i in range(len(group))] if group is not None else []
    else:
        msg = read_solver_state(state_file)
        iteration, current_step, learned = msg.iter, msg.current_step, msg.learned_net
        histories = [blobproto_to_array(b) for b in msg.history]
    entries = _history_entries(solver)
    if len(histories) != len(entries):
        raise CaffeError(f"{state_file}: the state holds {len(histories)} history blobs; this {solver.type_name} "
                         f"solver needs {len(entries)} (is it from another solver type or net?)")
    staged = []
    for (entry, shape), array in zip(entries, histories):
        if int(np.prod(array.shape)) != int(np.prod(shape)):
            raise CaffeError(f"{state_file}: history blob for {entry!r} has shape {array.shape}, "
                             f"the net needs {shape}")
        staged.append((entry, np.asarray(array, solver._dtype()).reshape(shape)))
    if learned:
        path = learned if os.path.exists(learned) else os.path.join(os.path.dirname(state_file),
                                                                     os.path.basename(learned))
        solver.net.copy_from(path)
    for entry, array in staged:
        solver.workspace.set(entry, array)
    solver.iter, solver.current_step = iteration, current_step
    if os.path.isfile(state_file + RUN_STATE_SUFFIX):
        with open(state_file + RUN_STATE_SUFFIX) as f:
            _set_run_state(solver, json.load(f))
