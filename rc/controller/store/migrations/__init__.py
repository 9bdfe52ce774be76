"""Schema migrations, one .sql file per version (rc.controller.store.db.MIGRATIONS)."""
