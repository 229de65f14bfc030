"""The bytecode VM: programs, the interpreter, the workspace, and the reference evaluator."""
from .bytecode import CALL, FREE, RET, Instr, Program, dis
from .interpreter import Executable
from .reference import eval_graph
from .workspace import Workspace, default_workspace

__all__ = ["CALL", "FREE", "RET", "Instr", "Program", "dis", "Executable", "eval_graph", "Workspace",
           "default_workspace"]
