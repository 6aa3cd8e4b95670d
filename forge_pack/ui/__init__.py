"""The search dashboard: a read-only HTTP server over a run store."""
