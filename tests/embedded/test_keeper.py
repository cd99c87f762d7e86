"""The embedded keeper (ZooKeeper from Debian's jars): it answers, stops by pid as ``chtxn embedded
down`` stops it, and starts again on the same data directory and port."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedded.keeper import EmbeddedKeeper, ask
from embedded.keeper_jars import find
from procs import stop_group
from tests.helpers import gone, wait_until


def test_keeper_jars_are_installed():
    jars = find()
    assert [jar.name for jar in jars.classpath][:2] == ["zookeeper.jar", "zookeeper-jute.jar"]
    assert all(jar.exists() for jar in jars.classpath)
    assert jars.version.startswith("3.")


def test_keeper_answers_stops_by_pid_and_starts_again_on_its_data(tmp_path: Path):
    data_dir = tmp_path / "keeper"
    keeper = EmbeddedKeeper(data_dir, log_path=tmp_path / "keeper.log")
    keeper.start()
    try:
        assert keeper.ask("ruok") == "imok"
        srvr = keeper.ask("srvr")
        assert srvr.startswith("Zookeeper version: 3.") and "Mode: standalone" in srvr, srvr
        assert (data_dir / "version-2").is_dir() and (data_dir / "zoo.cfg").exists()
        pid, token, port = keeper.pid, keeper.token, keeper.port

        assert stop_group(pid, token)  # by pid and start time, as `chtxn embedded down` does
        wait_until(lambda: gone(pid), 30, f"keeper pid {pid} to exit")
        with pytest.raises(OSError):
            ask(keeper.host, port, "ruok")
        keeper.stop()  # reaps what is left of it; idempotent

        keeper.start()  # the same object: the same port
        restarted = keeper.pid
        assert (keeper.port, keeper.ask("ruok")) == (port, "imok")
        assert restarted != pid
        keeper.stop()
        assert gone(restarted)

        again = EmbeddedKeeper(data_dir, port, log_path=tmp_path / "keeper.log").start()  # as `up` after `down`
        try:
            assert again.ask("srvr").startswith("Zookeeper version:")
        finally:
            again.stop()
    finally:
        keeper.stop()


def test_a_keeper_does_not_start_on_a_port_another_one_serves(tmp_path: Path):
    with EmbeddedKeeper(tmp_path / "first") as first:
        second = EmbeddedKeeper(tmp_path / "second", first.port)
        with pytest.raises(Exception, match="already in use"):
            second.start()
        assert not second.running()
