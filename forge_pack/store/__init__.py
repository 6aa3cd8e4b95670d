"""The run store: one SQLite database per run directory; all SQL of forge-pack lives in this package.

``run_store``: the schema, the writer (the search) and read-only connections; ``vocabulary``: the
words of its status and kind columns; ``run_queries``: a finished run read back (pack, LLM accounting,
``check``); ``dashboard_queries``: what the dashboard shows. No torch import.
"""
