"""The environment variables that make a process one rank of a multi-process trial.

localdet's launcher starts one process per slot and sets, in every process of the trial:

    LOCALDET_RANK          this process's rank: 0 .. LOCALDET_SIZE-1 (rank 0 is the chief)
    LOCALDET_SIZE          how many processes the trial has
    LOCALDET_CHIEF_ADDR    "127.0.0.1:PORT": where rank 0 listens for the other ranks
    LOCALDET_DIST_AUTHKEY  hex, at least 32 digits: one random key shared by the trial's
                           processes, so that nothing else on the machine can join them

With neither LOCALDET_RANK nor LOCALDET_SIZE set, a process is rank 0 of 1 and needs no
address or key. The launcher builds the variables here and the harness reads them here
(through `DistributedContext.from_environment()`), so the names live in one place:

    for env in distributed_environments(slots_per_trial):   # rank 0's first
        start_process(env={**base_env, **env})

    env = read_distributed_environment()    # in the trial process: rank, size, address, key
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from determined.core._reporting import AUTHKEY_VAR, CHIEF_ADDR_VAR, RANK_VAR, SIZE_VAR

_MIN_KEY_BYTES = 16  # a key an outsider cannot guess (the launcher makes 32 bytes)

Address = Tuple[str, int]


@dataclass(frozen=True)
class DistributedEnvironment:
    rank: int = 0
    size: int = 1
    chief_addr: Optional[Address] = None  # (host, port); None when size is 1
    authkey: Optional[bytes] = None       # None when size is 1


def read_distributed_environment(
        environ: Optional[Mapping[str, str]] = None) -> DistributedEnvironment:
    """This process's place in its trial, from the LOCALDET_* variables (default: the
    process's environment). Raises ValueError naming the variable that is missing or
    malformed: that is a launcher bug, better caught before training starts."""
    env = os.environ if environ is None else environ
    if not env.get(RANK_VAR) and not env.get(SIZE_VAR):
        return DistributedEnvironment()
    rank, size = _integer(env, RANK_VAR), _integer(env, SIZE_VAR)
    if size < 1:
        raise ValueError(f"{SIZE_VAR} must be at least 1, got {size}")
    if not 0 <= rank < size:
        raise ValueError(f"{RANK_VAR} must be in [0, {size}) since {SIZE_VAR} is {size}, "
                         f"got {rank}")
    if size == 1:
        return DistributedEnvironment()
    address, authkey = read_rendezvous(env)
    for name, value in ((CHIEF_ADDR_VAR, address), (AUTHKEY_VAR, authkey)):
        if value is None:
            raise ValueError(f"{name} is not set, but a trial of {size} processes needs it "
                             f"({RANK_VAR}={rank}, {SIZE_VAR}={size})")
    return DistributedEnvironment(rank, size, address, authkey)


def read_rendezvous(environ: Optional[Mapping[str, str]] = None
                    ) -> Tuple[Optional[Address], Optional[bytes]]:
    """LOCALDET_CHIEF_ADDR and LOCALDET_DIST_AUTHKEY, each None when unset. Every constructor
    of DistributedContext uses them, so collectives work under localdet whatever told the
    process its rank (LOCALDET_RANK, Horovod, TF_CONFIG)."""
    env = os.environ if environ is None else environ
    address = parse_address(env[CHIEF_ADDR_VAR], CHIEF_ADDR_VAR) \
        if env.get(CHIEF_ADDR_VAR) else None
    authkey = None
    if env.get(AUTHKEY_VAR):
        try:
            authkey = bytes.fromhex(env[AUTHKEY_VAR])
        except ValueError:
            raise ValueError(f"{AUTHKEY_VAR} must be hexadecimal digits") from None
        if len(authkey) < _MIN_KEY_BYTES:
            raise ValueError(f"{AUTHKEY_VAR} must have at least {2 * _MIN_KEY_BYTES} hex "
                             f"digits, got {len(env[AUTHKEY_VAR])}")
    return address, authkey


def parse_address(text: str, what: str) -> Address:
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")  # "[::1]:1234"
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} must be HOST:PORT, e.g. 127.0.0.1:29500, got {text!r}")
    return host, int(port)


def distributed_environments(size: int, host: str = "127.0.0.1") -> List[Dict[str, str]]:
    """The LOCALDET_* variables of each process of a trial of `size` processes, rank 0's
    first: a port free now on `host` for the chief, and a fresh random key. (The port is
    free when chosen; were it taken before rank 0 listens, rank 0 fails saying so.)"""
    if size < 1:
        raise ValueError(f"a trial needs at least 1 process, got {size}")
    if size == 1:
        return [{RANK_VAR: "0", SIZE_VAR: "1"}]
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    authkey = secrets.token_hex(32)
    return [{RANK_VAR: str(rank), SIZE_VAR: str(size), CHIEF_ADDR_VAR: address,
             AUTHKEY_VAR: authkey} for rank in range(size)]


def _integer(env: Mapping[str, str], name: str) -> int:
    text = env.get(name)
    if not text:
        raise ValueError(f"{name} is not set, but {RANK_VAR} and {SIZE_VAR} go together")
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None
