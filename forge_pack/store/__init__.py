"""The run store: one SQLite database per run directory; all SQL lives here."""
