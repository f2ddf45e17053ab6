"""Write one combined multi-node training log of a given size (default 1 GiB) with a fault inside.

Realistic mix: torchrun-prefixed progress lines from 512 ranks, NCCL INFO chatter with
host prefixes, Python warnings, and near the end an Xid-free CUDA OOM on one rank
followed by watchdog timeouts on the others. Used by bench/ and the memory check.
    python bench/make_big_log.py OUT [SIZE_MB]
"""

import random
import sys

TEMPLATES = [
    "[rank{r}]:[I321 {hh}:{mm}:{ss}.{us} train.py:{ln}] step {step} loss {loss:.4f} lr 3.0e-4 tokens/s 41234 grad_norm 1.02",
    "gpu{n:03d}:{pid}:{tid} [{g}] NCCL INFO Channel {c:02d}/0 : {r} -> {r2} via P2P/IPC/read",
    "[rank{r}]: /usr/lib/python3/dist-packages/torch/utils/data/dataloader.py:558: UserWarning: This DataLoader will create 8 worker processes",
    "gpu{n:03d}:{pid}:{tid} [{g}] NCCL INFO comm 0x55d5c1a0 rank {r} nranks 512 cudaDev {g} busId 3b000 - Init COMPLETE",
    "[rank{r}]:[I321 {hh}:{mm}:{ss}.{us} checkpoint.py:211] saved shard {c} of step {step} in 2.31s",
]


def main(out: str, size_mb: int = 1024) -> None:
    rnd = random.Random(42)
    target = size_mb << 20
    written, step = 0, 0
    with open(out, "w", encoding="utf-8") as fh:
        while written < target - 4096:
            step += 1
            buf = []
            for _ in range(2000):
                r = rnd.randrange(512)
                t = TEMPLATES[rnd.randrange(len(TEMPLATES))]
                buf.append(t.format(r=r, r2=(r + 1) % 512, n=r // 8, g=r % 8, pid=1000 + r, tid=2000 + r,
                                    c=rnd.randrange(32), hh="09", mm=f"{(step // 60) % 60:02d}",
                                    ss=f"{step % 60:02d}", us=f"{rnd.randrange(10**6):06d}",
                                    ln=rnd.randrange(900), step=step, loss=rnd.random() * 3))
            text = "\n".join(buf) + "\n"
            fh.write(text)
            written += len(text)
        fh.write("[rank77]:[E321 10:00:01.000000000 train.py:88] forward failed\n")
        fh.write("[rank77]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 5 has a "
                 "total capacity of 79.15 GiB of which 1.23 GiB is free.\n")
        for r in range(512):
            if r != 77:
                fh.write(f"[rank{r}]:[E321 10:10:02.408271257 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught "
                         "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=1, "
                         "NumelOut=1, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.\n")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1024)
