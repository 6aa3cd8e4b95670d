"""How `make test` spreads the suite over pytest-xdist workers: long modules first, and a scheduler for
``--dist loadscope`` that survives a crashed worker.

Order (``longest_first``, applied by tests/conftest.py in each worker, with ``--no-loadscope-reorder``
so the controller keeps it): xdist's own reorder hands out scopes by test count, which leaves the
one-test end-to-end modules (a build, the mutation guard: one to two minutes each) for the end of
the run, where one worker runs them while the other has nothing left. Modules with a ``slow`` test
that will run go first, the rest after them by test count as xdist would; every module's tests stay
together and in their own order.

Crashes:

`make test` runs ``-n auto --dist loadscope`` (a module's tests on one worker, so a module fixture
such as a built package is built once). In pytest-xdist 3.8.0, the newest the package mirror has,
a worker that dies mid-run (``node down: Not properly terminated``) can deadlock the whole session
(pytest-dev/pytest-xdist#1323, #1327, #1378): ``LoadScopeScheduling.remove_node`` puts every scope
the dead worker ever had back on the queue, finished ones included, which reach the survivors as
empty units that never complete; the test the worker died on stays pending and is run again; and a
replacement worker given a single one-test unit waits forever for a second item, because it is
never told to shut down. CI on 2026-12-06 hung that way for 75 minutes after one crash.

``CrashSafeLoadScope`` changes only those paths: a crashed worker's unfinished scopes go back to
the front of the queue, without the test it died on (xdist has already reported that one as
failed); finished scopes do not; and a worker is told to shut down as soon as the queue is empty
(it still runs everything it was given), so a worker holding the last unit never waits for more;
work sent to a worker that has died but whose crash has not been processed yet (a broken pipe,
an INTERNALERROR in xdist) is left assigned to it, and the crash puts it back on the queue; and a
replacement worker that has not finished collecting is given nothing until it has (xdist would
index its missing collection: a KeyError, #1189).
A crash is then one failed test and the run goes on. ``tests/test_xdist_schedule.py`` runs a
crashing suite through it.
"""

from __future__ import annotations

import pytest


def _scope(item) -> str:
    return item.nodeid.rsplit("::", 1)[0]  # xdist's loadscope unit: a module, or a class in one


def _runs(item) -> bool:
    return not any(m.name == "skip" for m in item.iter_markers())


def longest_first(items: list) -> None:
    """Sort ``items`` in place: the scopes holding a ``slow`` test that is not skipped first, then by
    descending test count (xdist's own loadscope order), each scope's tests together, in order."""
    count: dict[str, int] = {}
    slow: set[str] = set()
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        s = _scope(item)
        count[s] = count.get(s, 0) + 1
        first.setdefault(s, i)
        if "slow" in item.keywords and _runs(item):
            slow.add(s)
    items.sort(key=lambda it: (_scope(it) not in slow, -count[_scope(it)], first[_scope(it)]))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    return _scheduler_class()(config, log)


def _scheduler_class():
    from xdist.scheduler import LoadScopeScheduling

    class CrashSafeLoadScope(LoadScopeScheduling):
        def remove_node(self, node):
            workload = self.assigned_work.pop(node)
            if not self._pending_of(workload):
                return None
            crashitem = next(nodeid for unit in workload.values() for nodeid, done in unit.items() if not done)
            workload[self._split_scope(crashitem)][crashitem] = True  # reported failed; not run again
            for scope, unit in workload.items():
                if not all(unit.values()):
                    self.workqueue[scope] = unit
                    self.workqueue.move_to_end(scope, last=False)
            for other in self.assigned_work:
                self._reschedule(other)
            return crashitem

        def _assign_work_unit(self, node):
            try:
                super()._assign_work_unit(node)
            except OSError:  # the worker died with this report still queued: its errordown requeues the unit
                pass

        def _reschedule(self, node):
            if node.shutting_down or node not in self.registered_collections:
                return  # a replacement still collecting: scheduled when its collection arrives
            while self.workqueue and self._pending_of(self.assigned_work[node]) <= 2:
                self._assign_work_unit(node)
            if not self.workqueue:
                node.shutdown()

    return CrashSafeLoadScope
