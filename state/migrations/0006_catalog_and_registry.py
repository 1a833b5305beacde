"""What living with many experiments needs: archiving, notes, labels and lineage on
experiments, and a model registry of named models whose numbered versions point at
checkpoints.

- experiments.archived: left out of the default listings, nothing removed.
- experiments.notes: free text beside the one-line description.
- experiments.parent_id: the experiment this one was forked from (no foreign key: the
  parent may be deleted later, and the fork keeps saying where it came from).
- experiment_labels: one row per label, so that listings filter on a label with an index.
- models / model_versions: a version's checkpoint is a foreign key, so that SQLite itself
  refuses to delete a registered checkpoint's row.
"""


def apply(db):
    db.execute("ALTER TABLE experiments ADD COLUMN archived INTEGER NOT NULL DEFAULT 0 "
               "CHECK (archived IN (0, 1))")
    db.execute("ALTER TABLE experiments ADD COLUMN notes TEXT NOT NULL DEFAULT ''")
    db.execute("ALTER TABLE experiments ADD COLUMN parent_id INTEGER")
    db.execute("""
        CREATE TABLE experiment_labels (
            experiment_id INTEGER NOT NULL REFERENCES experiments(id),
            label TEXT NOT NULL CHECK (length(label) > 0),
            PRIMARY KEY (experiment_id, label)
        )
        """)
    db.execute("CREATE INDEX experiment_labels_by_label ON experiment_labels (label)")
    db.execute("""
        CREATE TABLE models (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE CHECK (length(name) > 0),
            description TEXT NOT NULL DEFAULT '',
            notes TEXT NOT NULL DEFAULT '',
            labels TEXT NOT NULL DEFAULT '[]',      -- JSON list
            metadata TEXT NOT NULL DEFAULT '{}',    -- JSON object
            archived INTEGER NOT NULL DEFAULT 0 CHECK (archived IN (0, 1)),
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )
        """)
    db.execute("""
        CREATE TABLE model_versions (
            id INTEGER PRIMARY KEY,
            model_id INTEGER NOT NULL REFERENCES models(id),
            version INTEGER NOT NULL,
            checkpoint_uuid TEXT NOT NULL REFERENCES checkpoints(uuid),
            name TEXT NOT NULL DEFAULT '',
            comment TEXT NOT NULL DEFAULT '',
            notes TEXT NOT NULL DEFAULT '',
            labels TEXT NOT NULL DEFAULT '[]',      -- JSON list
            metadata TEXT NOT NULL DEFAULT '{}',    -- JSON object
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            UNIQUE (model_id, version)
        )
        """)
    db.execute("CREATE INDEX model_versions_by_checkpoint ON model_versions (checkpoint_uuid)")
