"""The words the run store's status and kind columns hold. No torch import.

Writers and readers name these constants instead of spelling the strings, so that a filter can
only ask for a value some writer stores. Plain strings (not Enum members): they go into SQLite and
JSON as they are, and rows read back compare equal to them.
"""

from __future__ import annotations


class RunStatus:
    """``runs.status``."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    ALL = (RUNNING, FINISHED, FAILED, INTERRUPTED)


class HotspotStatus:
    """``hotspots.status``."""

    PENDING = "pending"
    SEARCHING = "searching"
    DONE = "done"
    SKIPPED = "skipped"
    ALL = (PENDING, SEARCHING, DONE, SKIPPED)


class StopReason:
    """``hotspots.stop_reason``: how a hotspot's search ended (NULL while it runs or after a crash)."""

    BUDGET = "budget"
    TIME_LIMIT = "time_limit"
    EXHAUSTED = "exhausted"  # the proposers ran dry
    STOPPED = "stopped"  # the dashboard's stop, or Ctrl-C
    OUT_OF_MEMORY = "out_of_memory"  # the signature's own sets do not fit the device: no candidate can be evaluated
    # Ends that need no more work unless the flags give the search more to do (search.pipeline's resume step).
    ENDED = (BUDGET, TIME_LIMIT, EXHAUSTED, OUT_OF_MEMORY)
    ALL = (BUDGET, TIME_LIMIT, EXHAUSTED, STOPPED, OUT_OF_MEMORY)


class NodeStatus:
    """``nodes.status``."""

    PENDING = "pending"
    EVALUATING = "evaluating"
    DONE = "done"
    ALL = (PENDING, EVALUATING, DONE)


class MoveKind:
    """``nodes.move_kind``: where a node's candidate came from."""

    ROOT = "root"
    TEMPLATE = "template"
    LLM = "llm"
    REPAIR = "repair"
    ALL = (ROOT, TEMPLATE, LLM, REPAIR)
    BY_LLM = (LLM, REPAIR)


class EventKind:
    """``events.kind``. The dashboard polls them by seq (the heartbeat is a column of runs, not an event)."""

    RUN_START = "run_start"
    RUN_END = "run_end"
    HOTSPOT_START = "hotspot_start"
    HOTSPOT_DONE = "hotspot_done"
    HOTSPOT_SKIPPED = "hotspot_skipped"
    NODE_ADDED = "node_added"
    EVAL_START = "eval_start"
    EVAL_DONE = "eval_done"
    LLM_CALL = "llm_call"
    CONTROL = "control"
    NOTE = "note"
    ALL = (RUN_START, RUN_END, HOTSPOT_START, HOTSPOT_DONE, HOTSPOT_SKIPPED, NODE_ADDED, EVAL_START, EVAL_DONE,
           LLM_CALL, CONTROL, NOTE)


# The event a hotspot status change writes (pending writes none: it is only ever the initial value).
HOTSPOT_EVENT = {HotspotStatus.SEARCHING: EventKind.HOTSPOT_START, HotspotStatus.DONE: EventKind.HOTSPOT_DONE,
                 HotspotStatus.SKIPPED: EventKind.HOTSPOT_SKIPPED}


class LLMOutcome:
    """``llm_calls.outcome``: what one chat completion came to."""

    OK = "ok"
    HTTP_ERROR = "http_error"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    AUTH = "auth"
    UNPARSEABLE = "unparseable"
    REFUSED = "refused"
    STATIC_CHECK = "static_check"
    DUPLICATE = "duplicate"  # a reply (paid for) that repeats a kernel already in the tree
    BUDGET = "budget"  # the budget was spent: the request was never sent
    ERROR = "error"
    ALL = (OK, HTTP_ERROR, TIMEOUT, CONNECTION, AUTH, UNPARSEABLE, REFUSED, STATIC_CHECK, DUPLICATE, BUDGET, ERROR)
    # Rows that record a request never sent: no call, no tokens, not a failure of the endpoint.
    NOT_SENT = (BUDGET,)


class MetaKey:
    """``meta.key``: small facts about the run."""

    SCHEMA_VERSION = "schema_version"
    FORWARD_US = "forward_us"  # the profiled forward time, for the summary on resume
    PROFILED = "profiled"  # "1" once every hotspot row is written: a resume need not profile again
    LLM_CONFIG = "llm_config"  # the effective LLM configuration (never the key), as JSON
