"""A model's version numbers are never given twice: `models.last_version` is the highest
number the model ever gave, kept when that version is deleted, so a name like "mnist
version 3" never comes to mean another checkpoint."""


def apply(db):
    db.execute("ALTER TABLE models ADD COLUMN last_version INTEGER NOT NULL DEFAULT 0")
    db.execute("UPDATE models SET last_version = (SELECT COALESCE(MAX(version), 0) "
               "FROM model_versions v WHERE v.model_id = models.id)")
