"""The planner's remembered answers (runtime/plan_memo.py) are the pure functions' own, per table:
a rebuilt table never reads another table's answers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.batch_plan import batch_depths
from runtime.plan_memo import PlanMemo
from tests.unit.test_plan import planner_cases
from tests.unit.test_step_plan import rows_of


@settings(max_examples=60, deadline=None)
@given(planner_cases(), planner_cases(), st.data())
def test_answers_are_batch_depths_own_for_each_table(first, second, data):
    memo, batches = PlanMemo(), [data.draw(st.composite(rows_of)()) for _ in range(3)]
    for rows in batches * 2:  # each batch asked twice, of both tables, in turn
        for table in (first[0], second[0]):
            assert memo.batch_depths(rows, table, max_k=3, slack=0.1) == batch_depths(rows, table, max_k=3, slack=0.1)


def test_a_question_is_computed_once_per_table():
    memo, calls = PlanMemo(), []
    first, second = object(), object()
    for table in (first, first, second, first):
        memo.answer(table, "q", lambda t=table: calls.append(t) or len(calls))
    assert calls == [first, second]
