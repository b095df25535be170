"""Terminal units: large counts keep a unit instead of growing digits."""

from simulator.cli.render import fmt_bytes, fmt_count


def test_bytes_scale_to_the_largest_decimal_unit():
    assert fmt_bytes(999) == "999 B"
    assert fmt_bytes(1.5e3) == "1.50 KB"
    assert fmt_bytes(4.0e12) == "4.00 TB"
    assert fmt_bytes(1.28e20) == "128.00 EB"
    assert fmt_bytes(None) == "-"


def test_counts_scale_to_the_largest_decimal_unit():
    assert fmt_count(512) == "512"
    assert fmt_count(2.5e9) == "2.50 G"
    assert fmt_count(1.6384e22) == "16,384.00 E"
    assert fmt_count(3.25e19) == "32.50 E"
    assert fmt_count(7e15) == "7.00 P"
