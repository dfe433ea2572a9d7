"""The memory planner reads a strategy's memory terms from its row (issue 43): a plugin strategy with its
own engine module gets the formulas its row declares, and one that declares none is "not planned" (the
planner once gave every engine it did not know FSDP's numbers). The rows come from a module outside the
package, registered as plugins register them (LLMBENCH_STRATEGIES), no file of pytest-llmbench changed."""

import json
import subprocess
import sys

PLUGIN = '''
import dataclasses

from harness import strategies

ddp = strategies.get("ddp")
# a replica per rank like DDP's, built by an engine of its own: it declares DDP's memory formulas
strategies.register(dataclasses.replace(ddp, name="my-replica", engine="my_engines.replica",
                                        memory="replicated"))
# a strategy the planner knows nothing of
strategies.register(dataclasses.replace(ddp, name="my-mystery", engine="my_engines.mystery", memory=None))
'''


def _plan(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    (tmp_path / "my_strategies.py").write_text(PLUGIN)
    env = {"PYTHONPATH": str(tmp_path), "LLMBENCH_STRATEGIES": "my_strategies", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "pytest_llmbench.planner.cli", "--model", "gpt2-350m",
                           "--seq-len", "1024", "--world-size", "8", "--activation-gib", "2", *flags],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_a_plugin_strategy_gets_the_terms_its_row_declares_or_is_not_planned(tmp_path):
    done = _plan(tmp_path, "--strategy", "ddp,my-replica,my-mystery,fsdp", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    totals = {p["strategy"]: p["world_sizes"]["8"]["total_bytes"] for p in doc["plans"]}
    assert set(totals) == {"ddp", "my-replica", "fsdp"}
    assert totals["my-replica"] == totals["ddp"]  # DDP's formulas, not FSDP's (a replica, not a shard)
    assert totals["my-replica"] - totals["fsdp"] > 5 * 2**30
    assert doc["not_planned"] == [
        "not planned: my-mystery declares no memory terms (its row's memory is None)"]
    text = _plan(tmp_path, "--strategy", "my-mystery,ddp")
    assert text.returncode == 0, text.stderr
    assert "- not planned: my-mystery declares no memory terms" in text.stdout


FAMILY_PLUGIN = '''
import dataclasses

from harness import strategies
from pytest_llmbench.planner import families
from pytest_llmbench.planner.terms import Term


def moments(step):
    # an engine that keeps only a weight shard: nothing else
    weights = Term("weights", step.shape.weight_bytes_fp32 / step.n, "W / N (my engine's shard)")
    return [weights], [weights]


families.register("my-shard-only", families.Family(moments))
ddp = strategies.get("ddp")
strategies.register(dataclasses.replace(ddp, name="my-sharded", engine="my_engines.sharded",
                                        memory="my-shard-only"))
# a row naming a family nobody registered: not planned, with the planner's words
strategies.register(dataclasses.replace(ddp, name="my-unknown", engine="my_engines.unknown",
                                        memory="nobody-registered-this"))
'''


def test_a_plugin_adds_a_memory_family_and_a_row_that_names_it(tmp_path):
    """Issue 62: the memory families are a table a package extends (planner/families.py register); its
    row is planned with exactly its family's terms, and a row naming an unregistered family is not planned."""
    (tmp_path / "my_strategies.py").write_text(FAMILY_PLUGIN)
    env = {"PYTHONPATH": str(tmp_path), "LLMBENCH_STRATEGIES": "my_strategies", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "pytest_llmbench.planner.cli", "--model", "gpt2-350m",
                           "--seq-len", "1024", "--world-size", "8", "--activation-gib", "2", "--strategy",
                           "my-sharded,my-unknown,ddp", "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    (mine,) = [p for p in doc["plans"] if p["strategy"] == "my-sharded"]
    terms = {t["name"]: t["bytes"] for t in mine["world_sizes"]["8"]["terms"]}
    assert set(terms) == {"weights", "activations"} and terms["activations"] == 2 * 2**30
    assert doc["not_planned"] == [
        "not planned: my-unknown's memory family 'nobody-registered-this' is not registered with the planner "
        "(planner/families.py register; known: replicated, zero2, zero3, sharded, my-shard-only)"]
