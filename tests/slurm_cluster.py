"""A real one-node Slurm 22.05 for tests (Debian: slurm-wlm, slurmdbd, munge, mariadb-server,
slurm-wlm-mysql-plugin), started as root without systemd in a private folder with free ports:
munged, mariadbd, slurmdbd, slurmctld and slurmd (proctrack/linuxproc, task/none). Every Slurm
command runs with SLURM_CONF pointing here and TZ=UTC. `stop()` ends exactly the daemons it started.

    python -m tests.slurm_cluster /tmp/fl-slurm   # start one by hand and print its environment
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NEEDED = ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "mariadb-install-db", "sbatch", "sacct")
MISSING = [b for b in NEEDED if not shutil.which(b)]
REASON = (f"Slurm test cluster needs {MISSING} (Debian: apt-get install slurm-wlm slurmdbd munge mariadb-server "
          "slurm-wlm-mysql-plugin; .ci/run does it)") if MISSING else ""
NODE = "flnode1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, ok, timeout: float = 60, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-1500:] if log and log.exists() else ""
    raise RuntimeError(f"{what} did not come up in {timeout:.0f} s\n{tail}")


def _with_settings(conf: str, settings: dict[str, str]) -> str:
    """slurm.conf text with `settings` replacing the lines of the same keys (appended when absent)."""
    lines = conf.splitlines()
    for key, value in settings.items():
        at = [i for i, line in enumerate(lines) if line.split("=", 1)[0] == key]
        if at:
            lines[at[0]] = f"{key}={value}"
        else:
            lines.insert(len(lines) - 2, f"{key}={value}")  # before the node and partition lines
    return "\n".join(lines) + "\n"


class SlurmCluster:
    def __init__(self, root: Path, conf: dict[str, str] | None = None):
        self.root = Path(root)
        self.conf = conf or {}  # slurm.conf settings that replace the defaults below
        self.procs: list[subprocess.Popen] = []
        self.pids: list[int] = []  # daemons that fork themselves (munged, slurm*), from their pid files
        self.env = {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf"), "TZ": "UTC"}

    # ------------------------------------------------------------------ helpers
    def run(self, *cmd: str, check: bool = True, timeout: float = 60) -> str:
        out = subprocess.run(list(cmd), capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()[:500]}")
        return out.stdout

    def _daemon(self, *cmd: str) -> None:
        out = subprocess.run(list(cmd), capture_output=True, text=True, env=self.env, timeout=60)
        if out.returncode != 0:
            log = self.root / f"{cmd[0]}.log"
            tail = log.read_text(errors="replace")[-1000:] if log.exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()[-800:]}\n{tail}")
        self._pidfile(cmd[0])

    def _pidfile(self, name: str) -> None:
        p = self.root / f"{name}.pid"
        # the daemon creates the file, then writes its pid: wait for the pid, not the file
        _wait(f"{name} pid file", lambda: p.exists() and p.read_text().split(), 30, self.root / f"{name}.log")
        self.pids.append(int(p.read_text().split()[0]))

    # ------------------------------------------------------------------ start
    def start(self) -> "SlurmCluster":
        try:
            return self._start()
        except BaseException:
            self.stop()  # whatever was started before the failure
            raise

    def _start(self) -> "SlurmCluster":
        r = self.root
        for d in ("state", "spool", "mysql", "munge", "jobs"):
            (r / d).mkdir(parents=True, exist_ok=True)
        host = socket.gethostname().split(".")[0]
        self.ports = {k: _free_port() for k in ("ctld", "slurmd", "dbd", "mysql")}
        # munge: a private key and socket
        key = r / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        self.munge_socket = r / "munge" / "munge.socket"
        jwt = r / "state" / "jwt_hs256.key"  # slurmrestd's JWT tokens (scontrol token) are signed with it
        if not jwt.exists():
            jwt.write_bytes(os.urandom(32))
            jwt.chmod(0o600)
        subprocess.run(["munged", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                        f"--pid-file={r / 'munged.pid'}", f"--seed-file={r / 'munge' / 'seed'}",
                        f"--log-file={r / 'munged.log'}"], check=True, capture_output=True, timeout=30)
        self._pidfile("munged")
        # mariadb: its own data dir, socket and port on 127.0.0.1
        mysock = r / "mysql.sock"
        if not (r / "mysql" / "mysql").exists():
            subprocess.run(["mariadb-install-db", f"--datadir={r / 'mysql'}", "--user=root",
                            "--auth-root-authentication-method=socket", "--skip-test-db"],
                           check=True, capture_output=True, timeout=180)
        self.procs.append(subprocess.Popen(
            ["mariadbd", "--no-defaults", f"--datadir={r / 'mysql'}", f"--socket={mysock}", f"--port={self.ports['mysql']}",
             "--bind-address=127.0.0.1", "--user=root", f"--pid-file={r / 'mariadb.pid'}",
             "--innodb-buffer-pool-size=32M", "--skip-log-bin"],
            stdout=open(r / "mariadb.log", "wb"), stderr=subprocess.STDOUT))
        _wait("mariadb", mysock.exists, 60, r / "mariadb.log")
        sql = ("CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw';"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;")
        _wait("mariadb accepting", lambda: subprocess.run(["mariadb", f"--socket={mysock}", "-e", sql],
                                                          capture_output=True).returncode == 0, 60, r / "mariadb.log")
        (r / "slurmdbd.conf").write_text(f"""AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={jwt}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={self.ports['dbd']}
SlurmUser=root
PidFile={r / 'slurmdbd.pid'}
LogFile={r / 'slurmdbd.log'}
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.ports['mysql']}
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
""")
        (r / "slurmdbd.conf").chmod(0o600)
        (r / "slurm.conf").write_text(_with_settings(f"""ClusterName=faultline
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={self.ports['ctld']}
SlurmdPort={self.ports['slurmd']}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={jwt}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'slurmd.pid'}
SlurmctldLogFile={r / 'slurmctld.log'}
SlurmdLogFile={r / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={self.ports['dbd']}
AccountingStoragePass={self.munge_socket}
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
KillWait=2
InactiveLimit=0
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={host} CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
""", self.conf))
        self._daemon("slurmdbd")
        _wait("slurmdbd", lambda: self._port_open(self.ports["dbd"]), 60, r / "slurmdbd.log")
        self.run("sacctmgr", "-i", "add", "cluster", "faultline", check=False)
        self._daemon("slurmctld")
        self._daemon("slurmd", "-N", NODE)
        _wait("the node", lambda: "idle" in self.run("sinfo", "-h", "-o", "%T", check=False), 90,
              r / "slurmctld.log")
        self.restd_url = None
        if shutil.which("slurmrestd") and shutil.which("setpriv"):
            self._start_restd()
        return self

    def _start_restd(self) -> None:
        """slurmrestd refuses to run as root: it runs as nobody, and authenticates each request by its JWT
        (SLURM_JWT=daemon makes it talk to slurmctld/slurmdbd with the caller's token)."""
        port = self.ports["restd"] = _free_port()
        # nobody cannot enter a private test folder: it reads a copy of slurm.conf from a readable one
        self.restd_dir = Path(tempfile.mkdtemp(prefix="fl-slurmrestd-"))
        self.restd_dir.chmod(0o755)
        conf = self.restd_dir / "slurm.conf"
        shutil.copy(self.root / "slurm.conf", conf)
        conf.chmod(0o644)
        env = {**self.env, "SLURM_JWT": "daemon", "SLURM_CONF": str(conf)}
        self.procs.append(subprocess.Popen(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "slurmrestd", "-a", "rest_auth/jwt",
             "-s", "openapi/v0.0.38,openapi/dbv0.0.38", f"127.0.0.1:{port}"],
            env=env, stdout=open(self.root / "slurmrestd.log", "wb"), stderr=subprocess.STDOUT))
        _wait("slurmrestd", lambda: self._port_open(port), 30, self.root / "slurmrestd.log")
        self.restd_url = f"http://127.0.0.1:{port}"

    def token(self, user: str = "root", lifespan: int = 3600) -> str:
        return self.run("scontrol", "token", f"username={user}", f"lifespan={lifespan}").strip().split("=", 1)[1]

    @staticmethod
    def _port_open(port: int) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    # ------------------------------------------------------------------ jobs
    def sbatch(self, script: str, *args: str) -> str:
        path = self.root / "jobs" / f"job-{time.monotonic_ns()}.sh"
        path.write_text("#!/bin/bash\n" + script + "\n")
        out = self.run("sbatch", "--parsable", f"--chdir={self.root / 'jobs'}",
                       f"--output={self.root / 'jobs'}/slurm-%j.out", *args, str(path))
        return out.strip().split(";")[0]

    def state(self, job_id: str) -> str:
        out = self.run("sacct", "-n", "-P", "-X", "-j", job_id, "--format=State", check=False).strip()
        return out.splitlines()[-1].split()[0] if out else ""

    def wait_done(self, job_ids: list[str], timeout: float = 240) -> dict[str, str]:
        done = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL")
        states: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = {j: self.state(j) for j in job_ids}
            if all(s.startswith(done) for s in states.values()):
                return states
            time.sleep(2)
        raise RuntimeError(f"jobs did not finish: {states}")

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            p.terminate()
        deadline = time.monotonic() + 20
        for pid in self.pids:
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
        for p in self.procs:
            try:
                p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        if getattr(self, "restd_dir", None):
            shutil.rmtree(self.restd_dir, ignore_errors=True)


if __name__ == "__main__":
    c = SlurmCluster(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/fl-slurm")).start()
    print(f"export SLURM_CONF={c.env['SLURM_CONF']} TZ=UTC   # pids {c.pids} {[p.pid for p in c.procs]}")
