"""A one-node SLURM cluster on this machine for `make test-slurm`: Debian's munged, slurmctld and slurmd run as
children of the test, with all their files in one folder and ports picked free; of the machine's own paths it uses
only /run/slurm/conf (see RUN_CONF), and it reads nothing of /etc/slurm or /etc/munge. The node declares what
`slurmd -C` finds (CPUs and memory) and `gpus` GPUs that are empty files (SLURM drops a GPU without a file): SLURM
allocates them (`--gpus=N`), and the jobs run on the CPU. `stop()` cancels the jobs, ends the daemons it started
and removes what it made."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sinfo", "scontrol", "scancel")
PARTITION = "main"
# Where SLURM's commands look for the configuration after $SLURM_CONF and /etc/slurm/slurm.conf (a configless
# cluster's slurmd links its config cache there). The executor plugin starts each rule inside its job with a nested
# srun whose environment it strips of every SLURM_* variable but the job's identity, SLURM_CONF included: that srun
# finds this cluster only here.
RUN_CONF = Path("/run/slurm/conf")
SITE_CONF = Path("/etc/slurm/slurm.conf")


class ClusterError(RuntimeError):
    """SLURM could not be started here (the message says what is missing and how to get it)."""


def missing_programs() -> list[str]:
    return [p for p in (*DAEMONS, "mungekey", *CLIENTS) if shutil.which(p) is None]


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_line(gpus: int) -> str:
    """This machine as slurmd sees it (`slurmd -C`: CPUs, sockets, cores, memory), with `gpus` GPUs declared."""
    probe = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30)
    line = next((x for x in probe.stdout.splitlines() if x.startswith("NodeName=")), None)
    if probe.returncode or line is None:
        raise ClusterError(f"slurmd -C did not describe this node: {probe.stdout}{probe.stderr}")
    return f"{line} NodeAddr=127.0.0.1 Gres=gpu:{gpus} State=UNKNOWN"


class OneNodeCluster:
    def __init__(self, gpus: int):
        self.gpus = gpus
        self.root = Path(tempfile.mkdtemp(prefix="dmacoll-slurm-"))
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.root / "conf" / "slurm.conf"
        self.linked = False
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- set-up -----------------------------------------------------------------------------------------------
    def write_config(self) -> None:
        r = self.root
        for d in ("conf", "munge", "state", "spool", "log", "dev"):
            (r / d).mkdir(mode=0o700)
        ctld_port, d_port = free_ports(2)
        node = node_line(self.gpus)
        name = node.split()[0].split("=", 1)[1]
        self.conf.write_text("\n".join([
            "ClusterName=dmacolltest",
            f"SlurmctldHost={name}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={d_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={r}/munge/munge.socket",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd.pid",
            "ProctrackType=proctrack/linuxproc",  # no cgroups needed: works in containers
            "TaskPlugin=task/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",  # --gpus needs it
            "SelectTypeParameters=CR_Core_Memory",  # memory is allocated: a job asking more than the node is refused
            "GresTypes=gpu",
            "AccountingStorageType=accounting_storage/none",  # no slurmdbd: sacct cannot answer, squeue must
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "MinJobAge=600",  # finished jobs stay visible to squeue and scontrol while the test reads them
            "SlurmdTimeout=60",
            node,
            f"PartitionName={PARTITION} Nodes={name} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        for i in range(self.gpus):  # slurmd complains that they are not devices, and counts them
            (r / "dev" / f"gpu{i}").touch()
        (r / "conf" / "gres.conf").write_text(f"NodeName={name} Name=gpu File={r}/dev/gpu[0-{self.gpus - 1}]\n")
        self.node = name

    def spawn(self, name: str, args: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)
        log.close()

    def start(self, timeout_s: float = 60) -> None:
        missing = missing_programs()
        if missing:
            raise ClusterError(f"not installed: {' '.join(missing)} (make test-slurm installs Debian's slurmctld, "
                               "slurmd, slurm-client and munge as root)")
        if SITE_CONF.exists() or RUN_CONF.exists() or RUN_CONF.is_symlink():
            raise ClusterError(f"this machine has a SLURM configuration of its own ({SITE_CONF} or {RUN_CONF}): the "
                               "jobs' nested srun would find it instead of the test cluster's")
        self.write_config()
        self.made_run_dir = not RUN_CONF.parent.exists()
        RUN_CONF.parent.mkdir(parents=True, exist_ok=True)
        RUN_CONF.symlink_to(self.conf.parent)
        self.linked = True
        m = self.root / "munge"
        run = subprocess.run(["mungekey", "--create", "--keyfile", str(m / "munge.key")], capture_output=True,
                             text=True, timeout=30)
        if run.returncode:
            raise ClusterError(f"mungekey failed: {run.stderr}")
        # --force: munged refuses to run as root without it (CI runs as root)
        self.spawn("munged", ["munged", "--foreground", "--force", f"--socket={m}/munge.socket",
                              f"--key-file={m}/munge.key", f"--pid-file={m}/munged.pid",
                              "--log-file=/dev/null", f"--seed-file={m}/munged.seed"])  # logs to stderr too
        self.wait_for(lambda: (m / "munge.socket").exists(), timeout_s, "munged's socket")
        self.spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self.spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self.wait_for(self.node_idle, timeout_s, f"node {self.node} idle in sinfo")

    def node_idle(self) -> bool:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, env=self.env,
                           timeout=30)
        return r.returncode == 0 and r.stdout.strip() == "idle"

    def wait_for(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(dead)} exited" if dead else f"not within {timeout_s:.0f} s"
                raise ClusterError(f"waiting for {what}: {why}\n{self.logs()}")
            time.sleep(0.2)

    # -- use --------------------------------------------------------------------------------------------------
    def run(self, *args: str, timeout_s: float = 60) -> str:
        r = subprocess.run(list(args), capture_output=True, text=True, env=self.env, timeout=timeout_s)
        if r.returncode:
            raise ClusterError(f"{' '.join(args)}: {r.stderr}")
        return r.stdout

    def jobs(self) -> list[dict[str, str]]:
        """Every job slurmctld still holds (finished ones for MinJobAge), as `scontrol show job` fields."""
        out = self.run("scontrol", "show", "job", "--oneliner")
        jobs = []
        for line in out.splitlines():
            if not line.startswith("JobId="):
                continue
            fields = {}
            for item in line.split():
                key, _, value = item.partition("=")
                fields[key] = value
            jobs.append(fields)
        return jobs

    def logs(self, lines: int = 30) -> str:
        parts = []
        for f in sorted((self.root / "log").glob("*")):
            text = f.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {f.name} (last {lines} lines)\n" + "\n".join(text))
        return "\n".join(parts)

    # -- tear-down --------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel every job, end the daemons (SIGTERM, then SIGKILL to their sessions) and remove the folder."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--quiet", f"--partition={PARTITION}"], env=self.env,
                           capture_output=True, timeout=30)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.running_jobs():
                time.sleep(0.5)
        for name in reversed(DAEMONS):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=15)
        if self.linked:
            RUN_CONF.unlink()
            if self.made_run_dir:
                RUN_CONF.parent.rmdir()
        shutil.rmtree(self.root, ignore_errors=True)

    def running_jobs(self) -> bool:
        r = subprocess.run(["squeue", "-h", "-t", "PD,R,CG", "-o", "%i"], capture_output=True, text=True,
                           env=self.env, timeout=30)
        return r.returncode == 0 and bool(r.stdout.strip())
