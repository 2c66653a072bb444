"""Bus-bandwidth arithmetic and nccl-tests log parsing of training/benchmarks/speed/allreduce.py."""

from __future__ import annotations

import pytest

from training.benchmarks.speed.allreduce import bus_bandwidth, expected_busbw, main, parse_nccl_tests, parse_size

# The shape of an all_reduce_perf log (2 nodes x 8 GPUs); numbers made up, columns as nccl-tests prints.
NCCL_TESTS_LOG = """\
# nThread 1 nGpus 1 minBytes 8 maxBytes 2147483648 step: 2(factor) warmup iters: 5 iters: 100
#  Rank  0 Group  0 Pid  11 on node-1 device  0 [0x10] NVIDIA A100-SXM4-40GB
#  Rank  1 Group  0 Pid  12 on node-2 device  0 [0x10] NVIDIA A100-SXM4-40GB
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    40.10    0.00    0.00      0    39.90    0.00    0.00      0
  1073741824     268435456     float     sum      -1    27500    39.04   73.20      0    27400    39.19   73.48      0
  2147483648     536870912     float     sum      -1    51200    41.94   78.64      0    51100    42.03   78.80      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 50.61
"""


def test_bus_bandwidth_follows_nccl_tests_definition():
    algbw, busbw = bus_bandwidth(2 * 10**9, 0.5, ranks=8)
    assert algbw == pytest.approx(4.0)
    assert busbw == pytest.approx(4.0 * 2 * 7 / 8)
    assert bus_bandwidth(10**9, 1.0, ranks=1)[1] == 0


def test_sizes_parse_with_binary_suffixes():
    assert [parse_size(s) for s in ("64K", "1M", "2G", "100")] == [65536, 2**20, 2**31, 100]
    with pytest.raises(SystemExit, match="bad message size"):
        parse_size("lots")


def test_expected_figures_per_instance_type():
    assert expected_busbw("p4d.24xlarge", nodes=2)[0] == pytest.approx(78.3)
    assert 440 <= expected_busbw("p5.48xlarge", nodes=2)[0] <= 490
    assert expected_busbw("g4dn.12xlarge", nodes=2)[0] == pytest.approx(5.0)
    assert expected_busbw("m5.large", nodes=2)[0] is None


def test_nccl_tests_log_becomes_the_same_json(tmp_path, capsys):
    results, ranks = parse_nccl_tests(NCCL_TESTS_LOG)
    assert ranks == 2 and [r.bytes for r in results] == [8, 2**30, 2**31]
    log = tmp_path / "nccl.log"
    log.write_text(NCCL_TESTS_LOG)
    assert main(["--nccl-tests", str(log), "--nodes", "2", "--instance-type", "p4d.24xlarge",
                 "--out", str(tmp_path / "r.json")]) == 0
    import json

    summary = json.loads((tmp_path / "r.json").read_text())
    assert summary["busbw_gbs"] == pytest.approx(78.64)
    assert summary["verdict"].startswith("ok: 100%")
    low = NCCL_TESTS_LOG.replace("78.64", "20.00").replace("73.20", "19.00")
    log.write_text(low)
    main(["--nccl-tests", str(log), "--nodes", "2", "--instance-type", "p4d.24xlarge"])
    assert '"verdict": "low: 26% of expected' in capsys.readouterr().out
