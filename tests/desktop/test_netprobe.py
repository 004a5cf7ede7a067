"""Network figures from the agent's own requests."""

from __future__ import annotations

from pathlib import Path

from desktop.netprobe import MIN_SEGMENTS_FOR_LOSS, NetProbe


def test_rtt_is_a_median_and_small_transfers_do_not_count() -> None:
    p = NetProbe(snmp=Path("/nonexistent/snmp"))
    assert p.figures().to_dict() == {
        "rtt_ms": None,
        "up_mbps": None,
        "down_mbps": None,
        "loss": None,
    }
    for s in (0.05, 0.06, 2.0):  # one slow answer does not move the median much
        p.rtt(s)
    assert p.figures().rtt_ms == 60.0
    p.transfer(1000, 0.01, upload=True)  # too small to measure bandwidth
    assert p.figures().up_mbps is None


def test_throughput_takes_the_latency_out() -> None:
    p = NetProbe()
    p.transfer(10_000_000, 1.1, upload=False, rtt_s=0.1)  # 10 MB in 1 s of wire time
    assert p.figures().down_mbps == 80.0
    p.transfer(1_000_000, 0.8, upload=True)
    assert round(p.figures().up_mbps or 0, 1) == 10.0


def test_a_small_models_update_on_a_slow_link_is_measured() -> None:
    """39 kB (the digits MLP's update) at 0.5 Mbit/s behind a 150 ms RTT: 0.62 s of wire."""
    p = NetProbe()
    p.transfer(38_800, 0.15 + 8 * 38_800 / 0.5e6, upload=True, rtt_s=0.15)
    assert round(p.figures().up_mbps or 0, 2) == 0.5


def _snmp(path: Path, sent: int, resent: int) -> None:
    path.write_text(
        "Ip: Forwarding DefaultTTL\nIp: 1 64\n"
        "Tcp: RtoAlgorithm InSegs OutSegs RetransSegs InErrs\n"
        f"Tcp: 1 100 {sent} {resent} 0\n"
    )


def test_loss_is_the_tcp_retransmission_rate_since_the_probe_started(tmp_path: Path) -> None:
    snmp = tmp_path / "snmp"
    _snmp(snmp, 10_000, 40)  # before the agent started: not counted
    p = NetProbe(snmp=snmp)
    _snmp(snmp, 10_000 + MIN_SEGMENTS_FOR_LOSS // 2, 45)
    assert p.figures().loss is None  # too few segments to say
    _snmp(snmp, 12_000, 60)
    assert p.figures().loss == 0.01  # 20 of 2,000 sent
    assert p.figures().to_dict()["loss"] == 0.01


def test_unreadable_counters_report_no_loss(tmp_path: Path) -> None:
    snmp = tmp_path / "snmp"
    snmp.write_text("Tcp: nonsense\n")
    assert NetProbe(snmp=snmp).figures().loss is None
