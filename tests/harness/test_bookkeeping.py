"""Each strategy's bookkeeping (harness/bookkeeping.py: the bytes its own code moves beside the model's
operators) held to what harness/instruments/bookkeeping.py measures of a real step at ws2, two
micro-batches, in fp32 and in bf16: every stated term to its measured row, and nothing measured left
unstated beyond control scalars."""

import pytest

from harness import bookkeeping, shapes, strategies
from tests.harness.conftest import STRATEGIES

STATED = [s for s in STRATEGIES if strategies.get(s).bookkeeping]


def _sizes(r) -> bookkeeping.Sizes:
    spec, payloads = r.spec, shapes.payloads(r.spec)
    sends = strategies.get(spec.strategy).stated_bytes(spec.variant_parts(), payloads, spec.grad_accum)
    root, block = shapes.tensor_numels(spec)  # elements (payloads' bytes halve with bf16)
    params = sum(root) + spec.n_layer * sum(block)
    return bookkeeping.sizes(spec, strategies.get(spec.strategy).bookkeeping, sends, params,
                             largest=max(root + block))


def check(r) -> None:
    assert r.ok, r.describe_failure()
    payload = r.instruments["bookkeeping"][0]
    assert "error" not in payload, payload
    measured: dict[tuple[str, str], float] = {}
    for row in payload["rows"]:
        measured[(row["where"], row["op"])] = measured.get((row["where"], row["op"]), 0.0) + row["bytes"]
    terms = bookkeeping.stated(strategies.get(r.spec.strategy).bookkeeping, _sizes(r))
    assert terms, r.spec.strategy
    stated: dict[tuple[str, str], list] = {}
    for term in terms:
        stated.setdefault((term.where, term.op), []).append(term)
    for key, group in stated.items():
        want, slack = sum(t.bytes for t in group), sum(t.slack for t in group)
        got = measured.get(key, 0.0)
        assert want * 0.99 <= got <= want * 1.01 + slack, (r.case_id, r.spec.precision, key, got, want, slack)
    rest = {k: v for k, v in measured.items() if k not in stated}
    total = sum(measured.values())
    assert total > 0
    assert sum(rest.values()) <= 0.005 * total, (r.case_id, sorted(rest.items(), key=lambda kv: -kv[1])[:5])


@pytest.mark.parametrize("strategy", STATED)
def test_fp32_bookkeeping_is_the_stated_bytes(strategy_results, strategy):
    check(strategy_results[strategy])


@pytest.mark.parametrize("strategy", STATED)
def test_bf16_bookkeeping_is_the_stated_bytes(bf16_results, strategy):
    check(bf16_results[(strategy, "base")])


def test_every_built_in_row_names_a_rule_measured_here():
    assert STATED == ["ddp", "fsdp", "fsdp1", "zero2", "zero3"]
    assert all(strategies.get(s).bookkeeping in bookkeeping.RULES for s in STATED)


def test_fsdp1s_divides_follow_its_predivide_factor():
    """torch's _get_gradient_predivide_factor: at N=2 only the pre-divide runs, at 64 both by 8."""
    assert bookkeeping.predivide(2) == (2.0, 1.0)
    assert bookkeeping.predivide(64) == (8.0, 8.0)
    assert bookkeeping.predivide(128) == (16.0, 8.0)
