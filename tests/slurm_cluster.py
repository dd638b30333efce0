"""A private two-node Slurm cluster on this one machine, for testing the launchers with real sbatch.

    python tests/slurm_cluster.py        start it, print the SLURM_CONF to export, stop it on Enter

munged, slurmctld and two slurmd (nodes labn1, labn2: one host, two ports) run as root with every
file in one temporary folder; stop() ends only the daemons started here, by their pids. Needs
Debian's slurm-wlm and munge, root, and the node names resolving (`127.0.0.1 labn1 labn2` in
/etc/hosts). Partitions mirror the course cluster: `normal` (default, 20 min) and `debug` (5 min),
and each node has one GPU, as a course node has: a GRES slot (gres.conf points it at /dev/null), so
`--gres=gpu:1` is granted, `--gres=gpu:4` refused, and the job gets SLURM_GPUS_ON_NODE; no real GPU.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODES = ("labn1", "labn2")
DAEMONS = ("munged", "slurmctld", "slurmd")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unavailable():
    """Why this machine cannot run the cluster, or None."""
    missing = [d for d in DAEMONS + ("sbatch", "scontrol") if not shutil.which(d)]
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the test cluster runs its daemons as root"
    for node in NODES:
        try:
            socket.gethostbyname(node)
        except OSError:
            return f"node name {node} does not resolve (add '127.0.0.1 {' '.join(NODES)}' to /etc/hosts)"
    return None


CONF = """\
ClusterName=lab5test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
KillWait=30
GresTypes=gpu
"""


def log_size(path):
    try:
        return os.path.getsize(path)
    except (OSError, TypeError):  # not written yet, or no StdOut field
        return None


def log_tail(path, chars=3000):
    try:
        return open(path, errors="replace").read()[-chars:]
    except (OSError, TypeError):
        return "(none)"


class SlurmCluster:
    def __init__(self):
        # munged wants every folder above its socket searchable by all: not pytest's 0700 tmp dirs
        self.root = Path(tempfile.mkdtemp(prefix="lab5-slurm-"))
        self.root.chmod(0o755)
        self.conf = self.root / "slurm.conf"
        # jobs inherit this environment (sbatch --export=ALL): the same Python as the caller's, and under
        # pytest conftest's one thread a process (the nodes claim 16 CPUs on what may be a 2-core machine)
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "PATH": path}
        self.pid_files = []

    def start(self):
        r = self.root
        (r / "state").mkdir()
        for node in NODES:
            (r / "spool" / node).mkdir(parents=True)
        (r / "munge.key").write_bytes(os.urandom(1024))
        (r / "munge.key").chmod(0o400)
        text = CONF.format(host=socket.gethostname(), ctld_port=free_port(), root=r)
        for node in NODES:
            text += (f"NodeName={node} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 Port={free_port()} "
                     "CPUs=16 Gres=gpu:1\n")
        text += f"PartitionName=normal Nodes={','.join(NODES)} Default=YES MaxTime=20 State=UP\n"
        text += f"PartitionName=debug Nodes={','.join(NODES)} MaxTime=5 State=UP\n"
        self.conf.write_text(text)
        (r / "gres.conf").write_text("Name=gpu File=/dev/null\n")  # read from slurm.conf's folder
        self._daemon(["munged", f"--key-file={r}/munge.key", f"--socket={r}/munge.sock", f"--pid-file={r}/munged.pid",
                      f"--log-file={r}/munged.log", f"--seed-file={r}/munged.seed"], r / "munged.pid")
        self._daemon(["slurmctld", "-f", str(self.conf)], r / "slurmctld.pid")
        for node in NODES:
            self._daemon(["slurmd", "-f", str(self.conf), "-N", node], r / f"slurmd-{node}.pid")
        deadline = time.time() + 60
        while time.time() < deadline:
            states = self.run("sinfo", "-h", "-N", "-o", "%T").split()
            if len(states) >= len(NODES) and all(s == "idle" for s in states):
                return self
            time.sleep(0.5)
        raise RuntimeError(f"nodes not idle after 60 s: {states}\n{self.logs()}")

    def _daemon(self, cmd, pid_file):
        subprocess.run(cmd, check=True, env=self.env, capture_output=True, timeout=30)
        self.pid_files.append(pid_file)

    def stop(self):
        """Cancel every job, then end the daemons started here (by pid) and remove the folder."""
        try:
            self.run("scancel", "--full", "--signal=KILL", "--user", "root")
        except (RuntimeError, subprocess.SubprocessError, OSError):
            pass
        for pid_file in reversed(self.pid_files):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        time.sleep(1)
        shutil.rmtree(self.root, ignore_errors=True)

    def run(self, *cmd, cwd=None):
        result = subprocess.run(cmd, env=self.env, cwd=cwd, capture_output=True, text=True, timeout=60)
        if result.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: exit {result.returncode}: {result.stderr.strip()}")
        return result.stdout

    def sbatch(self, *args, cwd):
        """Submit as a user would (`sbatch ARGS` in cwd); the job id."""
        return int(self.run("sbatch", "--parsable", *map(str, args), cwd=cwd).strip().split(";")[0])

    def job(self, job_id):
        """scontrol's record of the job as a dict (JobState, ExitCode, Restarts, StdOut, ...)."""
        line = self.run("scontrol", "show", "job", "-o", str(job_id))
        return dict(field.split("=", 1) for field in line.split() if "=" in field)

    def wait(self, job_id, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"),
             timeout=300, requeue_now=True):
        """Poll until the job is in one of `states`; give up after `timeout` s without a sign of life (a
        new state, or its log growing), so that a loaded machine's slow run is waited for and a hung one
        is not. A requeued job waits for its BeginTime (Slurm adds ~2 minutes); requeue_now moves it to
        now, as `scontrol update` lets an admin do, but only once the run before it has fully left its
        node (all nodes idle) and a second more has passed: slurmd refuses a job whose credential was
        issued in the same second as the old one's revocation ("Job credential revoked"; both times are
        whole seconds)."""
        deadline, idle_since, seen = time.time() + timeout, None, None
        while time.time() < deadline:
            job = self.job(job_id)
            if job["JobState"] in states:
                return job
            life = (job["JobState"], job.get("Restarts"), log_size(job.get("StdOut")))
            if life != seen:
                deadline, seen = time.time() + timeout, life
            waiting = requeue_now and job["JobState"] == "PENDING" and job.get("Reason") == "BeginTime"
            idle_since = (idle_since or time.time()) if waiting and self.idle() else None
            if idle_since and time.time() - idle_since >= 2:
                self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")  # StartTime: the begin time
                idle_since = None
            time.sleep(0.5)
        raise TimeoutError(f"job {job_id} still {job['JobState']}, no sign of life for {timeout} s\n"
                           f"{self.run('scontrol', 'show', 'job', str(job_id))}\n"
                           f"--- the job's log (end):\n{log_tail(job.get('StdOut'))}\n{self.logs()}")

    def idle(self):
        return all(state == "idle" for state in self.run("sinfo", "-h", "-N", "-o", "%T").split())

    def wait_idle(self, timeout=90):
        deadline = time.time() + timeout
        while not self.idle():
            if time.time() > deadline:
                raise TimeoutError(f"nodes not idle after {timeout} s\n{self.run('squeue')}\n{self.logs()}")
            time.sleep(0.5)

    def cancel_all(self):
        """End every job of this cluster (a failed test's), then wait for the nodes to be idle."""
        self.run("scancel", "--user", "root")
        self.wait_idle()

    def logs(self):
        return "\n".join(f"--- {p.name}\n" + p.read_text()[-2000:] for p in sorted(self.root.glob("*.log")))


if __name__ == "__main__":
    reason = unavailable()
    if reason:
        sys.exit(f"error: {reason}")
    cluster = SlurmCluster().start()
    print(f"export SLURM_CONF={cluster.conf}    # then sbatch/squeue/scontrol; Enter stops the cluster")
    try:
        input()
    finally:
        cluster.stop()
