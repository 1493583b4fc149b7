"""Every role of a process has a NATS connection of its own, named after it (issue 11)."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from bus.callout import new_issuer_seed, write_issuer_seed
from jobsched.runtime import Connection, Roles, connections_of
from tests.conftest import SettingsFactory
from tests.natsauth import AuthedNatsServer
from tests.support import start_stack


def test_a_process_opens_one_connection_per_role_it_runs() -> None:
    assert connections_of(Roles(gateway=True)) == [Connection.GATEWAY, Connection.LIVE]
    assert connections_of(Roles(scheduler=True)) == [Connection.SCHEDULER, Connection.RECORDER]
    assert connections_of(Roles(scheduler=True, recorder=False)) == [Connection.SCHEDULER]
    assert connections_of(Roles(worker=True)) == [Connection.WORKER]
    assert connections_of(Roles(notifier=True)) == [Connection.NOTIFIER]
    everything = Roles(gateway=True, scheduler=True, worker=True, notifier=True)
    assert connections_of(everything, callout=True) == list(Connection)
    assert Connection.CALLOUT not in connections_of(everything)
    assert connections_of(Roles(worker=True), callout=True) == [Connection.WORKER]


async def test_the_server_sees_each_roles_connection_by_name_and_user(
    make_settings: SettingsFactory, nats_binary: str, tmp_path: Path, prefix: str
) -> None:
    server = AuthedNatsServer(
        nats_binary, tmp_path / "nats", log_file=tmp_path / "nats.log", monitor=True
    )
    server.start()
    seed_file = tmp_path / "callout-issuer.nk"  # a gateway with it runs the auth callout too
    write_issuer_seed(seed_file, new_issuer_seed())
    settings = make_settings(nats_url=server.url, nats_callout_issuer_seed_file=str(seed_file))
    try:
        async with (
            start_stack(settings, Roles(gateway=True, scheduler=True, worker=True, notifier=True)),
            aiohttp.ClientSession() as http,
            http.get(server.monitor_url + "/connz?auth=true") as r,
        ):
            connz = await r.json()
    finally:
        server.stop()
    users = sorted((c.get("name", ""), c.get("authorized_user")) for c in connz["connections"])
    assert users == sorted((f"jobsched-{c}", f"{prefix}-{c}") for c in Connection)
