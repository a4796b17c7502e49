"""Launch specs: the declarative description of how to launch a candidate's kernels for a card."""

from engine.launch.expr import Env, Expr, SpecError, TensorInfo
from engine.launch.spec import (
    CTYPES,
    MAX_SHARED_BYTES,
    ArgSpec,
    Launch,
    LaunchSpec,
    ResolvedArg,
    ResolvedLaunch,
    ResolvedSpec,
    StaleWorkspacesKept,
    Workspace,
    WorkspacesKept,
    keeping_workspaces,
    parse_spec,
    resolve,
    spec_to_toml,
)

__all__ = [
    "CTYPES", "MAX_SHARED_BYTES", "ArgSpec", "Env", "Expr", "Launch", "LaunchSpec", "ResolvedArg",
    "ResolvedLaunch", "ResolvedSpec", "SpecError", "StaleWorkspacesKept", "TensorInfo", "Workspace",
    "WorkspacesKept", "keeping_workspaces", "parse_spec", "resolve", "spec_to_toml",
]
