"""docker-compose.yml holds together: stores with healthchecks, servers waiting for them,
two gateways and a separate persister behind the proxy. Where the docker client has the
compose plugin, `docker compose config` must accept the file as well."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from im_server.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_stores_have_healthchecks_and_servers_wait_for_them() -> None:
    services = _compose()["services"]
    for store in ("postgres", "redis", "s3"):
        assert services[store]["healthcheck"]["test"], store
    assert "--appendonly" in services["redis"]["command"]
    servers = [n for n, s in services.items() if s.get("build")]
    assert {"gateway1", "gateway2", "persister", "migrate"} <= set(servers)
    for name in ("gateway1", "gateway2", "persister"):
        deps = services[name]["depends_on"]
        assert deps["postgres"]["condition"] == "service_healthy"
        assert deps["redis"]["condition"] == "service_healthy"
        assert deps["s3"]["condition"] == "service_healthy"
        assert deps["migrate"]["condition"] == "service_completed_successfully"
        env = services[name]["environment"]
        assert env["IM_DATABASE_URL"].startswith("postgresql+asyncpg://")
        # the single Redis unless the cluster profile's URL is given
        assert env["IM_REDIS_URL"].startswith("${IM_REDIS_URL:-redis://"), env["IM_REDIS_URL"]
        assert env["IM_REDIS_URL"].endswith("@redis:6379/0}")
        assert env["IM_REDIS_CLUSTER"] == "${IM_REDIS_CLUSTER:-false}"
        cluster = deps["valkey-cluster"]
        assert cluster == {"condition": "service_completed_successfully", "required": False}
        assert env["IM_S3_ENDPOINT"] == "http://s3:8333"
    names = {
        services[n]["environment"]["IM_NODE_NAME"] for n in ("gateway1", "gateway2", "persister")
    }
    assert len(names) == 3, "each process needs its own node name"
    for gw in ("gateway1", "gateway2"):
        assert "--no-persister" in services[gw]["command"]
    assert services["persister"]["command"] == ["im-server", "persister"]


def test_the_cluster_profile_forms_six_valkey_nodes() -> None:
    """`--profile cluster`: six Valkey nodes in cluster mode, each with AOF and the one
    password (for clients and for replication), and a one-shot service that forms them
    into three primaries with a replica each once they are healthy."""
    services = _compose()["services"]
    nodes = [f"valkey-{n}" for n in range(1, 7)]
    for name in nodes:
        node = services[name]
        assert node["profiles"] == ["cluster"], name
        command = " ".join(node["command"])
        for flag in (
            "--cluster-enabled yes",
            "--cluster-require-full-coverage no",  # one shard's failure stays on that shard
            "--appendonly yes",
            "--requirepass",
            "--masterauth",
        ):
            assert flag in command, (name, flag)
        assert node["environment"]["NODE_NAME"] == name  # the hostname it announces
        assert "ports" not in node, "cluster nodes stay on the compose network"
        assert node["healthcheck"]["test"]
    form = services["valkey-cluster"]
    assert form["profiles"] == ["cluster"]
    assert set(form["depends_on"]) == set(nodes)
    script = " ".join(form["command"])
    assert "--cluster create" in script and "--cluster-replicas 1" in script
    assert "cluster_state:ok" in script  # formed once, not again on the next start


def test_commands_exist() -> None:
    """Every command the compose file runs is a real `im-server` subcommand."""
    services = _compose()["services"]
    for s in services.values():
        cmd = s.get("command")
        if isinstance(cmd, list) and cmd and cmd[0] == "im-server":
            try:
                cli_main([*cmd[1:], "--help"])
            except SystemExit as e:
                assert e.code == 0, cmd


def test_proxy_routes_to_both_gateways_with_upgrades() -> None:
    services = _compose()["services"]
    proxy = services["proxy"]
    assert proxy["depends_on"]["gateway1"]["condition"] == "service_healthy"
    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    assert "server gateway1:8000;" in conf and "server gateway2:8000;" in conf
    assert "proxy_set_header Upgrade $http_upgrade;" in conf
    mount = proxy["volumes"][0].split(":")[0]
    assert (ROOT / mount).exists()


def test_docker_compose_config_accepts_the_file() -> None:
    docker = shutil.which("docker")
    has_compose = (
        docker is not None
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    )
    if has_compose:
        env = {
            **os.environ,
            "POSTGRES_PASSWORD": "pw1",
            "REDIS_PASSWORD": "pw2",
            "S3_ACCESS_KEY": "key1key1",
            "S3_SECRET_KEY": "secret-secret-secret",
        }
        r = subprocess.run(
            [docker, "compose", "config", "-q"], cwd=ROOT, capture_output=True, text=True, env=env
        )
        assert r.returncode == 0, r.stderr
    else:  # no compose plugin on this machine: the YAML checks above are what runs
        assert _compose()["volumes"].keys() >= {"pgdata", "redisdata", "s3data"}


def test_no_secret_in_the_files_and_every_store_asks_for_one() -> None:
    """Passwords come from the environment (or `.env`, listed in .env.example); compose
    refuses to start without them, and Redis gets one too."""
    text = (ROOT / "docker-compose.yml").read_text()
    services = _compose()["services"]
    env = services["gateway1"]["environment"]
    assert "${POSTGRES_PASSWORD:?" in env["IM_DATABASE_URL"]
    assert "${REDIS_PASSWORD:?" in env["IM_REDIS_URL"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith(
        "${POSTGRES_PASSWORD:?"
    )
    cmd = services["redis"]["command"]
    assert cmd[cmd.index("--requirepass") + 1].startswith("${REDIS_PASSWORD:?")
    assert "im:im@" not in text
    example = (ROOT / ".env.example").read_text()
    for var in ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "S3_ACCESS_KEY", "S3_SECRET_KEY"):
        assert re.search(rf"^{var}=$", example, re.M), var
    assert ".env" in (ROOT / ".gitignore").read_text().split()
    # only the proxy (and the S3 port clients upload to) is reachable from outside; the
    # gateways are behind the proxy, so they may believe its X-Forwarded-For (login
    # throttling by client address)
    assert [n for n, s in services.items() if s.get("ports")] == ["s3", "proxy"]
    assert env["IM_FORWARDED_ALLOW_IPS"] == "*"


def test_s3_store_asks_for_keys_and_clients_get_its_published_address() -> None:
    """The S3 store's keys come from the environment like the passwords; the servers
    sign with the same ones, talk to it on the compose network, and hand clients URLs of
    the port it publishes."""
    services = _compose()["services"]
    s3 = services["s3"]
    assert s3["environment"]["AWS_ACCESS_KEY_ID"].startswith("${S3_ACCESS_KEY:?")
    assert s3["environment"]["AWS_SECRET_ACCESS_KEY"].startswith("${S3_SECRET_KEY:?")
    assert "-master.telemetry=false" in s3["command"] and s3["command"][0] == "mini"
    assert "-webdav=false" in s3["command"] and "-admin.ui=false" in s3["command"]
    env = services["gateway1"]["environment"]
    assert env["IM_S3_ACCESS_KEY"].startswith("${S3_ACCESS_KEY:?")
    assert env["IM_S3_SECRET_KEY"].startswith("${S3_SECRET_KEY:?")
    outside, inside = s3["ports"][0].split(":")
    assert inside == env["IM_S3_ENDPOINT"].rsplit(":", 1)[1] == "8333"
    public = re.fullmatch(r"\$\{IM_S3_PUBLIC_ENDPOINT:-(\S+)\}", env["IM_S3_PUBLIC_ENDPOINT"])
    assert public is not None and public.group(1) == f"http://localhost:{outside}"


def test_image_runs_as_a_user_and_proxies_log_no_query_strings() -> None:
    docker = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", docker, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    for conf in ("nginx.conf", "nginx-tls.conf"):
        text = (ROOT / "deploy" / conf).read_text()
        formats = re.findall(r"log_format\s+\w+\s+([^;]+);", text)
        assert formats, conf
        for fmt in formats:  # the WebSocket URL's query holds the token
            for var in ("$request ", '$request"', "$request_uri", "$args", "$query_string"):
                assert var not in fmt, (conf, var)
        assert "access_log" in text and "client_max_body_size 1m;" in text, conf
        # the gateways believe X-Forwarded-For: an edge proxy must not pass on a value
        # the client made up
        assert "$proxy_add_x_forwarded_for" not in text, conf
        assert "proxy_set_header X-Forwarded-For $remote_addr;" in text, conf


def _uncommented(text: str, first: str) -> str:
    """The commented block that starts with ``# <first>``, uncommented."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"# {first}")
    indent = lines[start].index("#")
    block = []
    for line in lines[start:]:
        if not line.strip().startswith("#"):
            break
        block.append(" " * indent + line[indent + 2 :])
    return "\n".join(block)


def test_the_commented_sygnal_service_and_its_config_hold_together() -> None:
    """Uncommented, the push gateway service mounts deploy/sygnal.yaml, publishes no port,
    and listens where the commented IM_PUSH_GATEWAY_URL points; the config's apps are
    APNs and FCM ones."""
    text = (ROOT / "docker-compose.yml").read_text()
    service = yaml.safe_load(_uncommented(text, "sygnal:"))["sygnal"]
    assert "ports" not in service
    mounts = dict(v.split(":")[:2] for v in service["volumes"])
    assert service["environment"]["SYGNAL_CONF"] == mounts["./deploy/sygnal.yaml"]
    conf = yaml.safe_load((ROOT / "deploy" / "sygnal.yaml").read_text())
    url = re.search(r"# IM_PUSH_GATEWAY_URL: (\S+)", text)
    assert url is not None and url.group(1) == f"http://sygnal:{conf['http']['port']}"
    assert {app["type"] for app in conf["apps"].values()} == {"apns", "gcm", "webpush"}
    [web] = [app for app in conf["apps"].values() if app["type"] == "webpush"]
    assert web["vapid_private_key"].startswith("/secrets/") and web["allowed_endpoints"]
