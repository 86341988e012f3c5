"""The limit ledger's rules, without a server: pacing within every 60 s window, priority and
fairness order, backoff, settling and leases (turnkeep.workflows.limits.ledger)."""

from __future__ import annotations

from turnkeep.contract.limits_io import CapacityRequest, LimitValues
from turnkeep.contract.turn_io import TaskPriority
from turnkeep.workflows.limits.ledger import WINDOW_SECONDS, Ledger, LedgerState


def ask(
    ledger: Ledger,
    n: int,
    now: float,
    *,
    priority: TaskPriority = "normal",
    key: str | None = None,
    tokens: int = 0,
    max_output: int | None = 0,
    lease: float = 600.0,
) -> str:
    request = CapacityRequest(
        limit="l",
        request_id=f"r{n}",
        workflow_id=f"turn-{n}",
        run_id="run",
        priority=priority,
        fairness_key=key,
        input_tokens=tokens,
        max_output_tokens=max_output,
        lease_seconds=lease,
    )
    ledger.ask(request, now)
    return request.key


def run(ledger: Ledger, start: float, until: float) -> list[tuple[float, str]]:
    """Drive the ledger as the limiter does: grant, then sleep until its next check."""
    now, granted = start, []
    while now < until:
        granted += [(now, lease.key) for lease in ledger.grants(now)]
        wake = ledger.next_check(now)
        if wake is None:
            break
        now = wake
    return granted


def test_pacing_never_exceeds_the_limit_in_any_window() -> None:
    ledger = Ledger(LimitValues(requests_per_minute=60))
    for n in range(200):
        ask(ledger, n, 0.0)
    granted = run(ledger, 0.0, 180.0)
    times = [t for t, _ in granted]
    assert len(times) >= 170  # about one a second, after a small burst
    for t in times:
        assert sum(1 for u in times if t <= u < t + WINDOW_SECONDS) <= 60
    # Paced: never a minute's worth at once.
    assert sum(1 for u in times if u < 5.0) <= 8


def test_tokens_pace_within_the_window() -> None:
    ledger = Ledger(LimitValues(tokens_per_minute=6000))
    for n in range(100):
        ask(ledger, n, 0.0, tokens=400, max_output=100)
    granted = run(ledger, 0.0, 300.0)
    times = [t for t, _ in granted]
    for t in times:
        assert 500 * sum(1 for u in times if t <= u < t + WINDOW_SECONDS) <= 6000


def test_interactive_request_behind_300_batch_ones_gets_the_next_slot() -> None:
    ledger = Ledger(LimitValues(requests_per_minute=120))
    for n in range(300):
        ask(ledger, n, 0.0, priority="batch")
    run(ledger, 0.0, 10.0)
    now = 10.0
    urgent = ask(ledger, 999, now, priority="interactive")
    wake = ledger.next_check(now)
    assert wake is not None and wake - now <= 60 / 120 + 0.01
    assert next(lease.key for lease in ledger.grants(wake)) == urgent


def test_fairness_between_two_keys() -> None:
    ledger = Ledger(LimitValues(requests_per_minute=60))
    for n in range(100):
        ask(ledger, n, 0.0, key="big")
    for n in range(100, 110):
        ask(ledger, n, 1.0, key="small")
    granted = run(ledger, 1.0, 30.0)
    small = {f"turn-{n}/run/r{n}" for n in range(100, 110)}
    smalls = [key for _, key in granted if key in small]
    # The small tenant's ten are not held behind the big one's hundred: they alternate.
    assert len(smalls) == 10
    assert len(granted) < 40


def test_backoff_holds_everything_until_it_ends() -> None:
    ledger = Ledger(LimitValues(requests_per_minute=600))
    first = ask(ledger, 0, 0.0)
    assert [lease.key for lease in ledger.grants(0.0)] == [first]
    ledger.settle(first, None, 30.0, 1.0)
    for n in range(1, 5):
        ask(ledger, n, 1.0, priority="interactive")
    assert ledger.grants(2.0) == []
    assert ledger.why("turn-1/run/r1", 2.0).startswith("backing off until")
    assert ledger.next_check(2.0) == 31.001
    assert len(ledger.grants(31.001)) == 4


def test_settle_corrects_the_token_window() -> None:
    ledger = Ledger(LimitValues(tokens_per_minute=10_000))
    first = ask(ledger, 0, 0.0, tokens=9000, max_output=None)
    ledger.grants(0.0)
    assert ledger.in_use(0.0) == (1, 9500)  # the input and, as yet, the default output
    second = ask(ledger, 1, 0.5, tokens=100, max_output=None)
    assert ledger.grants(0.5) == []
    assert ledger.why(second, 0.5).startswith("9500/10000 tpm")
    ledger.settle(first, 9050, None, 1.0)
    assert ledger.in_use(1.0) == (1, 9050)
    # The learned output (50) is the next estimates', and the settled window has room.
    ask(ledger, 2, 1.0, tokens=100, max_output=None)
    assert ledger.state.waiting[-1].tokens == 100 + 50


def test_concurrency_leases_expire() -> None:
    ledger = Ledger(LimitValues(concurrency=2))
    a, b, c = (ask(ledger, n, 0.0, lease=30.0) for n in range(3))
    assert [lease.key for lease in ledger.grants(0.0)] == [a, b]
    assert ledger.why(c, 1.0) == "2/2 concurrency"
    ledger.settle(a, None, None, 5.0)
    assert [lease.key for lease in ledger.grants(5.0)] == [c]
    # b never settles (its turn died): its slot comes back when its lease expires.
    d = ask(ledger, 4, 6.0)
    assert ledger.grants(6.0) == []
    assert ledger.next_check(6.0) == 30.001
    assert [lease.key for lease in ledger.grants(30.001)] == [d]


def test_withdraw_and_drop() -> None:
    ledger = Ledger(LimitValues(requests_per_minute=60, concurrency=1))
    a, b = ask(ledger, 0, 0.0), ask(ledger, 1, 0.0)
    ledger.withdraw(b, 0.0)
    assert [lease.key for lease in ledger.grants(0.0)] == [a]
    # A grant whose turn closed is as if never given.
    ledger.drop(a)
    assert ledger.in_use(0.0) == (0, 0)
    assert not ledger.is_known(a) and not ledger.is_known(b)


def test_asking_twice_queues_once_and_state_round_trips() -> None:
    ledger = Ledger(LimitValues(requests_per_minute=1))
    a = ask(ledger, 0, 0.0)
    ask(ledger, 0, 0.0)
    ask(ledger, 1, 0.0)
    assert len(ledger.grants(0.0)) == 1 and len(ledger.state.waiting) == 1
    carried = LedgerState.model_validate_json(ledger.state.model_dump_json())
    again = Ledger(LimitValues(requests_per_minute=1), carried)
    assert again.is_granted(a)
    assert again.why("turn-1/run/r1", 1.0) == "1/1 rpm"


def test_idle_once_nothing_is_left_to_remember() -> None:
    ledger = Ledger(LimitValues(requests_per_minute=60))
    assert ledger.idle(0.0)
    a = ask(ledger, 0, 0.0)
    assert not ledger.idle(0.0)
    ledger.grants(0.0)
    ledger.settle(a, None, 5.0, 1.0)
    assert not ledger.idle(30.0)  # in the window, and backing off until 6 s
    assert ledger.idle(62.5)  # the window, and its margin, are past
