"""Plans remembered per cost table: between the table's rebuilds (every few steps) a run of plain
decode asks the planner the same questions every step, and a width-4 plan cost ~1 ms of the event
loop's time a step on a 2-core AMD EPYC (profiled), time taken from the cores computing the step.

A table is keyed by identity and held while its answers are kept, so a rebuilt table (a new object)
never reads an old one's answers; the few latest tables are kept (the mean and the optimistic one
are read in the same step). Answers are those of the pure functions themselves, computed once.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable, TypeVar

from runtime.batch_plan import batch_depths

T = TypeVar("T")
TABLES = 4  # tables whose answers are kept
ANSWERS = 512  # answers kept per table (a plan's questions change only as acceptance evidence comes in)


class PlanMemo:
    def __init__(self):
        self._tables: OrderedDict[int, tuple[object, dict]] = OrderedDict()

    def answer(self, table, question: Hashable, compute: Callable[[], T]) -> T:
        """compute()'s value for this question about this table, computed once."""
        entry = self._tables.get(id(table))
        if entry is None or entry[0] is not table:
            entry = self._tables[id(table)] = (table, {})
            while len(self._tables) > TABLES:
                self._tables.popitem(last=False)
        answers = entry[1]
        if question not in answers:
            if len(answers) >= ANSWERS:
                answers.clear()
            answers[question] = compute()
        return answers[question]

    def batch_depths(self, rows, table, *, max_k: int, slack: float) -> tuple[int, ...]:
        """runtime/batch_plan.py's batch_depths, remembered."""
        key = ("batch_depths", tuple(rows), max_k, slack)
        return self.answer(table, key, lambda: batch_depths(rows, table, max_k=max_k, slack=slack))
