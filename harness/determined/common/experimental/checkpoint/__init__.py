"""The SDK's checkpoints: `Checkpoint` and its enums."""

from determined.common.experimental.checkpoint._checkpoint import (
    Checkpoint,
    CheckpointOrderBy,
    CheckpointSortBy,
    CheckpointState,
    CheckpointTrainingMetadata,
    DownloadMode,
    ModelFramework,
)

__all__ = ["Checkpoint", "CheckpointOrderBy", "CheckpointSortBy", "CheckpointState",
           "CheckpointTrainingMetadata", "DownloadMode", "ModelFramework"]
