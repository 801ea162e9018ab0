import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# the fluid model of a broadcast is a benchmark's tool, not part of the package
sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from _shardcast_sim import build_topology, simulate, simulate_relays


@pytest.mark.parametrize("n", [1, 3, 10])
def test_star_time_is_workers_times_file_over_upload(n):
    r = simulate("star", n, size=1e9, shards=10, upload=1e8)
    assert r.seconds == pytest.approx(n * 10.0)  # the origin's upload is the bottleneck
    assert r.transfers == n * 10


def test_tree_topology_respects_fanout_and_reaches_every_worker():
    nodes = build_topology("tree", 50, fanout=3)
    children: dict[int, int] = {}
    for _, parent in nodes[1:]:
        children[parent] = children.get(parent, 0) + 1
    assert max(children.values()) <= 3
    workers = [i for i, (name, _) in enumerate(nodes) if name.startswith("worker")]
    assert len(workers) == 50
    for w in workers:  # every worker's chain of parents ends at the origin
        hops, node = 0, w
        while nodes[node][1] is not None:
            node, hops = nodes[node][1], hops + 1
        assert node == 0 and hops <= 1 + math.ceil(math.log(50, 3))


def test_tree_grows_slowly_where_star_grows_linearly():
    def t(kind, n):
        return simulate(kind, n, 1e9, 20, 1e8, download=1e8).seconds

    assert t("star", 64) / t("star", 4) == pytest.approx(16, rel=0.01)
    assert t("tree", 64) / t("tree", 4) < 1.5
    assert t("star", 64) / t("tree", 64) > 10


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 12), shards=st.integers(1, 12), fanout=st.integers(2, 4),
       conc=st.integers(1, 4), kind=st.sampled_from(["star", "tree"]))
def test_every_worker_finishes_no_faster_than_the_links_allow(n, shards, fanout, conc, kind):
    r = simulate(kind, n, 1e6, shards, upload=1e6, download=2e6, concurrency=conc, fanout=fanout)
    assert r.seconds >= 1.0 - 1e-9  # one full copy through a 1 MB/s upload at least
    assert r.worker_mean_seconds <= r.seconds + 1e-9
    assert r.transfers == (n + r.relays) * shards
    if kind == "star":
        assert r.seconds == pytest.approx(n * 1.0)


def test_unknown_topology_is_refused():
    with pytest.raises(ValueError):
        build_topology("ring", 3)
    with pytest.raises(ValueError):
        build_topology("tree", 3, fanout=1)


def test_relays_model_star_and_two_relays_against_the_link_bound():
    size, upload = 200e6, 20e6
    star = simulate_relays(8, 0, size, 100, upload)
    assert star.seconds == pytest.approx(8 * size / upload)  # the origin carries every copy
    two = simulate_relays(8, 2, size, 100, upload)
    bound = size * (2 + 8) / 3 / upload  # 10 copies through 3 uploaders
    assert bound <= two.seconds <= 1.05 * bound
    never = simulate_relays(8, 2, size, 100, upload, serve_clients="never")
    assert never.seconds >= size * 8 / 2 / upload  # only the two relays serve the workers


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 8), relays=st.integers(0, 3), shards=st.integers(1, 10),
       conc=st.integers(1, 4), mode=st.sampled_from(["always", "spare"]))
def test_relays_model_every_worker_gets_every_shard(n, relays, shards, conc, mode):
    r = simulate_relays(n, relays, 1e6, shards, 1e6, concurrency=conc, serve_clients=mode)
    assert r.transfers == (n + relays) * shards
    assert r.seconds >= 1.0 - 1e-9  # the origin sends every byte at least once
    assert r.worker_mean_seconds <= r.seconds + 1e-9


def test_relays_model_refuses_impossible_setups():
    with pytest.raises(ValueError):
        simulate_relays(4, 0, 1e6, 4, 1e6, serve_clients="never")
    with pytest.raises(ValueError):
        simulate_relays(4, 1, 1e6, 4, 1e6, serve_clients="sometimes")
