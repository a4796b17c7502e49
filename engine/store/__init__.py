"""The workspace store: workspace directory resolution, the SQLite schema, async access for the engine
and the synchronous read side for viewers (`engine.store.read`)."""

from engine.store.sample_folders import SampleFolderLock, capture_writing, samples_being_written
from engine.store.schema import MIGRATIONS, latest_version
from engine.store.store import (
    RUN_UPDATABLE,
    SAMPLES_REMOVED,
    Store,
    StoreError,
    decode_json,
    encode_json,
    is_corruption,
    new_id,
    open_readonly,
    pack_single_file,
    row_from_dict,
    row_to_dict,
    samples_removed,
    unusable_database,
    writable,
)
from engine.store.workspace import (
    DB_FILENAME,
    ENV_VAR,
    WorkspaceError,
    db_path,
    ensure_workspace,
    resolve_workspace,
    samples_dir,
)

__all__ = [
    "DB_FILENAME",
    "ENV_VAR",
    "MIGRATIONS",
    "RUN_UPDATABLE",
    "SAMPLES_REMOVED",
    "SampleFolderLock",
    "Store",
    "StoreError",
    "WorkspaceError",
    "capture_writing",
    "db_path",
    "decode_json",
    "encode_json",
    "ensure_workspace",
    "is_corruption",
    "latest_version",
    "new_id",
    "open_readonly",
    "pack_single_file",
    "resolve_workspace",
    "row_from_dict",
    "row_to_dict",
    "samples_being_written",
    "samples_dir",
    "samples_removed",
    "unusable_database",
    "writable",
]
