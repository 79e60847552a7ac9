"""Ports for throw-away loopback consortia (services/loopback.py): drawn below the OS's ephemeral range, so an
outgoing connection cannot take one between the draw and the node's bind."""

from __future__ import annotations

import socket

import pytest

from fedgl_secure.services.loopback import (
    DEFAULT_EPHEMERAL_LOW,
    PORT_SPAN,
    ephemeral_port_low,
    free_ports,
    port_binds,
)


def test_ports_are_distinct_free_and_below_the_ephemeral_range():
    low = ephemeral_port_low()
    ports = free_ports(5)
    assert len(set(ports)) == 5
    assert all(max(1024, low - PORT_SPAN) <= port < low for port in ports)
    for port in ports:  # free when handed out
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_handed_out():
    port = next(p for p in free_ports(50) if port_binds(p + 1))  # a free port whose neighbour above is free too
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        for _ in range(10):  # a span of two ports, one of them busy: always the other
            assert free_ports(1, low=port + 2, span=2) == [port + 1]
        with pytest.raises(OSError, match="found 0 of 1 free ports"):
            free_ports(1, low=port + 1, span=1)


def test_the_range_is_read_from_the_os_setting_or_defaults(tmp_path):
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("40000\t60999\n", encoding="ascii")
    assert ephemeral_port_low(setting) == 40000
    assert ephemeral_port_low(tmp_path / "missing") == DEFAULT_EPHEMERAL_LOW
    setting.write_text("garbage", encoding="ascii")
    assert ephemeral_port_low(setting) == DEFAULT_EPHEMERAL_LOW


def test_too_few_ports_below_the_range_is_refused():
    with pytest.raises(ValueError, match="ports below the ephemeral range"):
        free_ports(3, low=1026)
