"""bench/collection_time.py (the paper's Fig. 5): a small real collection over ipc, and the onset rule."""
from bench import collection_time
from tianji.runtime import wire

WIRE = (wire.encode, wire.send, wire.recv, wire.decode)


def test_paced_actors_cannot_deliver_faster_than_they_sample(tmp_path):
    # 2 actors at 5 ms per sample: 40 samples take at least 40 * 5 ms / 2 = 0.1 s, whatever the link
    for mode in ("raw", "wire"):
        sec = collection_time.collect(f"ipc://{tmp_path}/c", mode, 4096, 40, 2, 0.005, WIRE)
        assert 0.1 <= sec < 10, (mode, sec)


def test_onset_is_the_first_point_slower_than_sampling_by_the_margin():
    pts = [{"actors": k, "seconds": s, "sampling_only_seconds": 8 / k}
           for k, s in ((1, 8.1), (2, 4.5), (4, 2.6), (8, 2.5))]
    assert collection_time._onset(pts) == 4  # 2.6 > 1.2 * 2.0; 4.5 <= 1.2 * 4.0
    assert collection_time._onset(pts[:2]) is None
    # the planner's unprofiled cost at 512 KB: 100 µs + 524288 B / 0.5 GB/s
    assert abs(collection_time.planner_default_mu(512 << 10) - (100e-6 + 524288 / 0.5e9)) < 1e-12
