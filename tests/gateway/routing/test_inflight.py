"""The in-flight ledger: placements counted from routing to the end of the stream."""

from gateway.routing.inflight import InflightLedger, InflightView


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_ticket_moves_from_prefilling_to_decoding_to_closed():
    ledger = InflightLedger()
    first, second = ledger.open(100), ledger.open(40)
    assert ledger.view() == InflightView(prefilling=2, prefill_tokens=140, decoding=0)
    first.first_token()
    first.first_token()  # idempotent
    assert ledger.view() == InflightView(prefilling=1, prefill_tokens=40, decoding=1)
    first.close()
    second.close()
    second.close()  # idempotent
    second.first_token()  # after close: no effect
    assert ledger.view() == InflightView()
    assert ledger.view().requests == 0


def test_a_negative_token_count_counts_as_zero():
    ledger = InflightLedger()
    ledger.open(-5)
    assert ledger.view().prefill_tokens == 0


def test_a_ticket_that_never_reaches_its_first_token_goes_stale():
    clock = Clock()
    ledger = InflightLedger(stale_after_s=10, clock=clock)
    lost, streaming = ledger.open(500), ledger.open(20)
    streaming.first_token()
    clock.now = 11.0
    # The lost placement stops counting; a stream that is decoding never goes stale.
    assert ledger.view() == InflightView(prefilling=0, prefill_tokens=0, decoding=1)
    assert lost.closed and not streaming.closed


def test_a_poll_keeps_only_the_load_beyond_our_own_placements():
    ledger = InflightLedger()
    ours = ledger.open(300)
    before = ledger.view()
    ledger.observe(3, 500, before)  # the pod: 3 running, 500 tokens; 1 and 300 are ours
    assert ledger.view().others_running == 2
    assert ledger.view().others_prefill_tokens == 200
    # A stale answer: it still shows our request, which has ended since it was asked for.
    before = ledger.view()
    ours.close()
    ledger.observe(1, 300, before)
    view = ledger.view()
    assert (view.requests, view.others_running, view.others_prefill_tokens) == (0, 0, 0)
