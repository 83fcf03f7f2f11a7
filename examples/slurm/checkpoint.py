#!/usr/bin/env python3
"""A training loop that checkpoints through ringfs (for examples/slurm/checkpoint-job.sh).

Each task (SLURM_PROCID) holds a state of a few MiB, advances it ``--steps`` times, saves it
every ``--every`` steps as ``DIR/step-N/rank-R.pkl`` and then points ``DIR/rank-R.latest`` at
it (written under a temporary name and renamed, so a crash leaves the previous pointer), and
on start resumes from the latest checkpoint it finds. Plain Python file I/O: under ringfs's
preload library the files are on ringfs, and in cache mode they reach the parallel file
system. Prints one line per checkpoint and ``rank R done at step N`` at the end.
"""

import argparse
import hashlib
import os
import pickle


def advance(state: dict) -> None:
    """One step of "training": every byte of the weights changes, deterministically."""
    digest = hashlib.sha256(state["weights"][:64] + state["step"].to_bytes(8, "little")).digest()
    weights = state["weights"]
    for start in range(0, len(weights), 4096):
        weights[start] ^= digest[start // 4096 % len(digest)]
    state["step"] += 1


def load_latest(directory: str, rank: int) -> dict | None:
    try:
        with open(f"{directory}/rank-{rank}.latest") as pointer:
            path = pointer.read().strip()
        with open(path, "rb") as checkpoint:
            return pickle.load(checkpoint)
    except FileNotFoundError:
        return None


def save(directory: str, rank: int, state: dict) -> None:
    step_dir = f"{directory}/step-{state['step']:06d}"
    os.makedirs(step_dir, exist_ok=True)
    path = f"{step_dir}/rank-{rank}.pkl"
    with open(path, "wb") as checkpoint:
        pickle.dump(state, checkpoint, protocol=pickle.HIGHEST_PROTOCOL)
    with open(f"{directory}/rank-{rank}.latest.tmp", "w") as pointer:
        pointer.write(path)
    os.replace(f"{directory}/rank-{rank}.latest.tmp", f"{directory}/rank-{rank}.latest")
    print(f"rank {rank} saved step {state['step']} to {path}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="checkpoint directory (e.g. /ringfs/pfs/ckpt)")
    parser.add_argument("--steps", type=int, default=1000, help="train until this step")
    parser.add_argument("--every", type=int, default=100, help="checkpoint every this many steps")
    parser.add_argument("--size-mb", type=int, default=8, help="state size per task")
    args = parser.parse_args()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    os.makedirs(args.dir, exist_ok=True)
    state = load_latest(args.dir, rank)
    if state is None:
        state = {"step": 0, "rank": rank, "weights": bytearray(os.urandom(args.size_mb << 20))}
    else:
        print(f"rank {rank} resumed at step {state['step']}", flush=True)
    while state["step"] < args.steps:
        advance(state)
        if state["step"] % args.every == 0:
            save(args.dir, rank, state)
    print(f"rank {rank} done at step {state['step']}", flush=True)


if __name__ == "__main__":
    main()
