"""torchft's fault-tolerant DDP on oxccl: replicas train a model together, one of them is
killed (SIGKILL) in the middle of the run and started again, and training goes on without
stopping the others.

    python torchft_ddp.py [--replicas 3] [--pg oxccl|gloo] [--seed S] [--after 20]

This script is the launcher: it runs torchft's lighthouse (which forms a quorum of the live
replicas at every step), starts the replicas (this script again, ``--replica I``; each is a
replica group of one process with its own store, as torchft runs them), kills a random
replica after a random step, starts it again, and stops the run ``--after`` steps after the
new one has committed its first step. Each replica trains with ``torchft.Manager``,
``torchft.ddp.DistributedDataParallel`` and ``torchft.optim.OptimizerWrapper`` on the process
group ``--pg`` names: ``oxccl`` (``oxccl.torchft.ProcessGroupOxccl``) or torchft's own ``gloo``,
to compare.

What the survivors do: the step the victim died in fails in its all_reduce (PeerLostError),
the Manager does not commit it, and at the next step the lighthouse forms a quorum without the
victim, torchft reconfigures the process group over the survivors, and they go on. The
restarted replica asks to join, the lighthouse puts it into the next quorum, it receives the
weights from a survivor (torchft's checkpoint transport) and trains on.

Checks (exit status 1 if one fails): every replica ends at the same step with bitwise the
same weights and optimizer state, the survivors committed steps while the victim was dead,
and the loss went down. Prints, per run: the time from the kill to the survivors' first
committed step after it, and from the restarted replica's start to its first committed step.
"""

import argparse
import hashlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta

WIDTH = 64


def replica(args):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torchft import Manager
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper

    if args.pg == "oxccl":
        from oxccl.torchft import ProcessGroupOxccl
        pg = ProcessGroupOxccl(timeout=timedelta(seconds=15))
    else:
        from torchft.process_group import ProcessGroupGloo
        pg = ProcessGroupGloo(timeout=timedelta(seconds=15))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1))
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def state_dict():
        return {"model": model.state_dict(), "optim": sgd.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        sgd.load_state_dict(sd["optim"])

    # The replica group's store (one process per group here).
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=pg, min_replica_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
        replica_id=f"replica_{args.replica}", store_addr="localhost", store_port=store.port,
        rank=0, world_size=1, lighthouse_addr=os.environ["TORCHFT_LIGHTHOUSE"], hostname="localhost",
        timeout=timedelta(seconds=15), quorum_timeout=timedelta(seconds=30),
        connect_timeout=timedelta(seconds=15))
    ddp = DistributedDataParallel(manager, model)
    optimizer = OptimizerWrapper(manager, sgd)
    target = torch.Generator().manual_seed(1)
    w_true = torch.randn(WIDTH, 1, generator=target)

    def say(*words):
        print(*words, flush=True)

    say("START", args.replica, time.monotonic())
    first_loss = None
    while True:
        stop = _read_stop(args.stop_file)
        if stop is not None and manager.current_step() >= stop:
            break
        step = manager.current_step()
        # Each replica's own data for this step.
        g = torch.Generator().manual_seed(args.replica * 1_000_003 + step)
        x = torch.randn(32, WIDTH, generator=g)
        y = x @ w_true
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        if manager.current_step() > step:
            first_loss = float(loss) if first_loss is None else first_loss
            say("STEP", args.replica, manager.current_step(), time.monotonic(), manager.num_participants())
        time.sleep(args.pause)
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.numpy().tobytes())
    for s in sgd.state.values():
        h.update(s["momentum_buffer"].numpy().tobytes())
    say("FINAL", args.replica, manager.current_step(), h.hexdigest(), first_loss, float(loss))
    manager.shutdown(wait=False)


def _read_stop(path):
    try:
        with open(path) as f:
            text = f.read().strip()
        return int(text) if text else None
    except (FileNotFoundError, ValueError):
        return None


class Replica:
    """A replica process and what it printed."""

    def __init__(self, args, index, lighthouse, events):
        env = dict(os.environ, TORCHFT_LIGHTHOUSE=lighthouse, PYTHONUNBUFFERED="1")
        cmd = [sys.executable, os.path.abspath(__file__), "--replica", str(index), "--pg", args.pg,
               "--stop-file", args.stop_file, "--pause", str(args.pause)]
        self.index, self.started = index, time.monotonic()
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.thread = threading.Thread(target=self._read, args=(events,), daemon=True)
        self.thread.start()

    def _read(self, events):
        for line in self.proc.stdout:
            self.lines.append(line)
            words = line.split()
            if words and words[0] in ("START", "STEP", "FINAL"):
                events.put((self, words))


def launch(args):
    import queue

    # torchft's lighthouse logs every quorum request at INFO; keep its warnings.
    os.environ.setdefault("RUST_LOG", "warn")
    from torchft._torchft import LighthouseServer

    rng = random.Random(args.seed)
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=args.join_timeout_ms,
                                  quorum_tick_ms=50, heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    events = queue.Queue()
    stop_dir = tempfile.mkdtemp(prefix="torchft-ddp-")
    args.stop_file = os.path.join(stop_dir, "stop")
    reps = [Replica(args, i, lighthouse.address(), events) for i in range(args.replicas)]
    victim, kill_at = rng.randrange(args.replicas), rng.randint(5, 12)
    print(f"{args.replicas} replicas on {args.pg}: replica {victim} will be killed after step {kill_at}", flush=True)
    deadline = time.monotonic() + args.timeout
    killed = restarted = None
    survivor_step_after_kill = rejoined = None
    steps, final = {}, {}
    ok = True
    try:
        while len(final) < args.replicas:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the run did not end in {args.timeout} s")
            try:
                rep, words = events.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if words[0] == "STEP":
                step, at = int(words[2]), float(words[3])
                steps[rep.index] = step
                if killed is None and rep.index == victim and step >= kill_at:
                    rep.proc.send_signal(signal.SIGKILL)
                    killed = time.monotonic()
                    rep.proc.wait()
                    print(f"killed replica {victim} (SIGKILL) after its step {step}", flush=True)
                    reps[victim] = Replica(args, victim, lighthouse.address(), events)
                    restarted = reps[victim]
                elif (killed is not None and rep is not restarted and survivor_step_after_kill is None
                      and int(words[4]) < args.replicas):
                    # The first step committed by a quorum without the victim.
                    survivor_step_after_kill = at - killed
                    print(f"survivors: first step committed {survivor_step_after_kill * 1000:.0f} ms after the kill "
                          f"(step {step}, {words[4]} replicas)", flush=True)
                elif rep is restarted and rejoined is None:
                    rejoined = at - rep.started
                    stop = max(steps.values()) + args.after
                    with open(args.stop_file, "w") as f:
                        f.write(str(stop))
                    print(f"restarted replica {victim}: first step committed (step {step}) {rejoined:.2f} s after "
                          f"its start; the run stops at step {stop}", flush=True)
            elif words[0] == "FINAL":
                final[rep.index] = words
    except BaseException as e:
        print(f"error: {e}", flush=True)
        ok = False
    finally:
        for rep in reps:
            if rep.proc.poll() is None:
                rep.proc.kill()
            rep.proc.wait()
            rep.thread.join(timeout=5)
        lighthouse.shutdown()
    digests = {w[3] for w in final.values()}
    ends = {int(w[2]) for w in final.values()}
    if ok and len(digests) == 1 and len(ends) == 1 and survivor_step_after_kill is not None:
        first, last = float(final[(victim + 1) % args.replicas][4]), float(final[(victim + 1) % args.replicas][5])
        if last < first:
            print(f"every replica ends at step {ends.pop()} with the same weights ({digests.pop()[:16]}); "
                  f"loss {first:.4f} -> {last:.4f}")
            print(f"recovery: {survivor_step_after_kill * 1000:.0f} ms kill->survivors' next step; "
                  f"{rejoined:.2f} s restart->first step")
            return 0
        print(f"the loss did not go down: {first} -> {last}")
    print(f"FAILED: finals {final}, survivors' step after the kill: {survivor_step_after_kill}")
    for rep in reps:
        print(f"--- replica {rep.index} (exit {rep.proc.returncode}):\n" + "".join(rep.lines[-40:]))
    return 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--pg", choices=["oxccl", "gloo"], default="oxccl")
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--after", type=int, default=20, help="steps to run after the restarted replica is back")
    p.add_argument("--pause", type=float, default=0.02, help="seconds of 'compute' per step")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--join-timeout-ms", type=int, default=500)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=1000)
    p.add_argument("--replica", type=int, help=argparse.SUPPRESS)
    p.add_argument("--stop-file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.replica is not None:
        replica(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
