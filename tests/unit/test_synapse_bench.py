"""The pure parts of ``im_server/bench/synapse.py``: the shared-secret registration MAC, the
signing key and the generated configuration (no Synapse here: it is installed by the
benchmark alone)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import yaml

from im_server.bench.synapse import (
    NESTED_RATE_LIMITS,
    RATE_LIMITS,
    homeserver_config,
    log_config,
    registration_mac,
    signing_key,
)

PG = {"user": "postgres", "password": "pw", "dbname": "synapse", "host": "127.0.0.1", "port": 5}


def test_registration_mac_known_values() -> None:
    # HMAC-SHA1(secret, "abcdef\0alice\0pw\0notadmin"), the value Synapse's admin API wants
    assert registration_mac("s3cret", "abcdef", "alice", "pw", False) == (
        "39f9da4ecd49a7da062156b00eac61f46cb28654"
    )
    assert registration_mac("s3cret", "abcdef", "alice", "pw", True) == (
        "a8e0dc874cad502be1c226f758182a92c2fffd75"
    )


def test_signing_key_is_an_ed25519_seed() -> None:
    algo, version, seed = signing_key().split()
    assert (algo, version) == ("ed25519", "a_bench")
    assert len(base64.b64decode(seed + "=" * (-len(seed) % 4))) == 32
    assert signing_key() != signing_key()


def test_config_loopback_client_only_no_limits(tmp_path: Path) -> None:
    conf = homeserver_config(tmp_path, 8123, PG, "the-secret")
    assert yaml.safe_load(json.dumps(conf)) == conf  # written as JSON, read as YAML
    (listener,) = conf["listeners"]
    assert listener["bind_addresses"] == ["127.0.0.1"] and listener["port"] == 8123
    assert [r["names"] for r in listener["resources"]] == [["client"]]  # no federation
    assert conf["registration_shared_secret"] == "the-secret"
    assert conf["enable_media_repo"] is False
    assert conf["database"]["name"] == "psycopg2"
    assert conf["database"]["args"]["port"] == 5
    for key in RATE_LIMITS:
        assert conf[key]["per_second"] >= 100_000
    for key, subs in NESTED_RATE_LIMITS.items():
        assert all(conf[key][s]["burst_count"] >= 100_000 for s in subs)
    assert conf["presence"] == {"enabled": True}  # Synapse's default, kept
    other = homeserver_config(tmp_path, 8123, PG, "the-secret", presence=False)
    assert other["macaroon_secret_key"] != conf["macaroon_secret_key"]
    assert other["presence"] == {"enabled": False}


def test_log_config_warning_to_a_file(tmp_path: Path) -> None:
    conf = log_config(tmp_path / "hs.log")
    assert conf["root"]["level"] == "WARNING"
    assert conf["handlers"]["file"]["filename"] == str(tmp_path / "hs.log")
