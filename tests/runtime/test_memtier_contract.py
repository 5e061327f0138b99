"""The memory tier's part of the operator <-> runtime contract (docs/contract.toml, [memory]): the runtime reads
exactly the variables the table says the operator sets, the defaults and names agree, and docs/contract.md lists
them. (tests/test_contract.py checks the operator's side of the older variables; the operator half of issue 24
adds its side of these.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from reprieve import progress
from reprieve.memtier import config, sources
from reprieve.memtier.tier import required_bytes
from reprieve.supervisor import contract

from tests.test_contract import _Recording

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TABLE = tomllib.loads((ROOT / "docs/contract.toml").read_text())["memory"]


def test_the_runtime_reads_the_memory_variables_the_table_lists() -> None:
    env = _Recording({"REPRIEVE_MEMORY_DIR": "/dev/shm/x"})
    config.MemoryConfig.from_env(env)
    asked = {n for n in env.asked if n.startswith("REPRIEVE_")}
    assert asked == set(TABLE["operator_sets"]) | set(TABLE["supervisor_sets"])
    assert {config.SERVER_ENV} == set(TABLE["supervisor_sets"])


def test_defaults_and_names_agree() -> None:
    d = TABLE["defaults"]
    cfg = config.MemoryConfig.from_env({"REPRIEVE_MEMORY_DIR": "/x"})
    assert cfg is not None
    assert (cfg.interval_steps, cfg.interval_seconds, cfg.port, cfg.budget) == (
        d["interval_steps"], d["interval_seconds"], d["port"], d["budget"])
    assert required_bytes(1) == d["copies_per_limit"]
    assert contract.MEMORY_PEERS_KEY == TABLE["assignment_key"]
    assert contract.MEMORY_PEER_NODES_KEY == TABLE["assignment_node_key"]
    assert contract.LOSS_EVERY_KEY == TABLE["assignment_loss_key"]
    assert contract.LOSS_EVERY_ENV == config.LOSS_EVERY_ENV and config.LOSS_EVERY_ENV in TABLE["operator_sets"]
    assert contract.MEMORY_PEER_NODE_ENV in TABLE["operator_sets"]
    assert contract.MEMORY_PEER_ENV in TABLE["operator_sets"]
    assert set(TABLE["progress_fields"]) <= set(progress.LIVE_FIELDS)


def test_the_restore_sources_are_the_contracts_words_in_its_order() -> None:
    """The runtime's one table of restore sources (reprieve.memtier.sources) is the contract's list, in the order
    of preference the contract gives it: a source added on one side only fails here."""
    assert list(sources.SOURCES) == TABLE["restore_sources"]
    for name, source in sources.SOURCES.items():
        assert source.name == name and source.where


def test_a_process_reads_each_writer_from_the_first_source_that_holds_a_copy() -> None:
    from reprieve.memtier.decide import Holding
    from reprieve.memtier.layout import CopyName

    def copy(location: str, tree: str) -> Holding:
        return Holding(CopyName(step=4, attempt=1, writer=0), 2, location, tree)

    own, peer = copy("10.0.0.1:8477", "own"), copy("10.0.0.2:8477", "peer")
    assert sources.choose_holder([peer, own], 0, "10.0.0.1:8477") is own  # own memory before a peer
    assert sources.choose_holder([peer, own], 1, "10.0.0.3:8477") is peer  # else the first a peer serves
    assert sources.choose_holder([], 0, "10.0.0.1:8477") is None  # storage: no memory copy to read


def test_the_docs_list_the_memory_environment() -> None:
    text = (ROOT / "docs/contract.md").read_text()
    section = text.split("## Memory tier", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(REPRIEVE_[A-Z_]+)` \|", section, flags=re.MULTILINE))
    assert listed == set(TABLE["operator_sets"])
    for field in TABLE["progress_fields"]:
        assert f"`{field}`" in section
    for word in (*TABLE["restore_tiers"], *TABLE["restore_sources"]):
        assert f'"{word}"' in section


def test_the_assignment_carries_the_pairing_to_the_trainer() -> None:
    data = {"attempt": "3", "numProcesses": "2", "coordinator": "10.0.0.1:8476",
            "processes": '{"j-0": 0, "j-spare-0": 1}', "memoryPeers": '{"0": "j-spare-0.j.ns.svc:8477"}'}
    a = contract.parse_assignment(data, "j-0", configmap="ns/j-assignment")
    assert a.env()["REPRIEVE_MEMORY_PEER"] == "j-spare-0.j.ns.svc:8477"
    assert contract.parse_assignment_line(a.line())["REPRIEVE_MEMORY_PEER"] == "j-spare-0.j.ns.svc:8477"
    spare = contract.parse_assignment(data, "j-spare-0", configmap="ns/j-assignment")
    assert spare.env()["REPRIEVE_MEMORY_PEER"] == ""  # listed without a peer: nobody
    plain = contract.parse_assignment({k: v for k, v in data.items() if k != "memoryPeers"}, "j-0",
                                         configmap="ns/j-assignment")
    assert "REPRIEVE_MEMORY_PEER" not in plain.env() and "memoryPeer" not in plain.line()
    with pytest.raises(contract.AssignmentError, match="memoryPeers must be a JSON object"):
        contract.parse_assignment({**data, "memoryPeers": "[1]"}, "j-0", configmap="ns/j-assignment")
    with pytest.raises(contract.AssignmentError, match=r"memoryPeers\[0\] must be host:port"):
        contract.parse_assignment({**data, "memoryPeers": '{"0": "nohost"}'}, "j-0", configmap="ns/j-assignment")
