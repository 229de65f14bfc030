"""The compiler: passes over the IR, memory planning, and codegen to VM bytecode."""
from .codegen import generate
from .memory import MemoryPlan, infer_slot_types, plan_memory
from .passes import (PIPELINE, SIGNATURE_STAGES, Pass, Signature, pass_names, prepare_signature, run_passes,
                     stage_names)
from .prune import prune

__all__ = ["generate", "MemoryPlan", "infer_slot_types", "plan_memory", "PIPELINE", "Pass", "pass_names",
           "run_passes", "prune", "SIGNATURE_STAGES", "Signature", "prepare_signature", "stage_names"]
