"""``make run``: mount a demo Rapid bucket from the embedded emulator.

Seeds a few sample objects into a persistent emulator folder (once), then
runs ``rapidmount --emulator`` in the foreground until Ctrl-C, which
unmounts cleanly.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import pathlib
import random
import sys

SAMPLES_MARKER = ".rapidmount-demo-seeded"


def sample_objects() -> dict[str, bytes]:
    rng = random.Random(2026)
    table = io.StringIO()
    writer = csv.writer(table)
    writer.writerow(["step", "loss", "accuracy"])
    for step in range(1, 201):
        writer.writerow([step, round(2.5 / step ** 0.5, 4), round(1 - 0.8 / step ** 0.3, 4)])
    objects = {
        "README.txt": b"Hello from a Rapid bucket, mounted by rapidmount.\n"
                      b"Every open file is one bidi gRPC stream to the bucket.\n",
        "datasets/metrics.csv": table.getvalue().encode(),
        "datasets/shards/shard-00000.bin": rng.randbytes(8 << 20),
        "datasets/shards/shard-00001.bin": rng.randbytes(8 << 20),
        "logs/train.log": b"".join(b"epoch %d done\n" % i for i in range(100)),
    }
    for i in range(100):
        objects[f"datasets/images/img-{i:03d}.jpg"] = rng.randbytes(16 << 10)
    return objects


def seed(data_dir: pathlib.Path, bucket: str) -> None:
    from rapidmount.emulator import Emulator

    marker = data_dir / SAMPLES_MARKER
    if marker.exists():
        return
    with Emulator(buckets={bucket: "zonal"}, data_dir=str(data_dir)) as emulator:
        for name, data in sample_objects().items():
            # Logs stay appendable (unfinalized), as a live writer leaves them.
            emulator.seed(bucket, name, data, finalize=not name.startswith("logs/"))
    marker.write_text(bucket + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bucket", default="demo-bucket")
    parser.add_argument("--mountpoint", default="/tmp/rapidmount-demo")
    parser.add_argument("--data-dir", default=os.path.expanduser("~/.cache/rapidmount-demo"))
    args = parser.parse_args(argv)
    data_dir = pathlib.Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    mountpoint = pathlib.Path(args.mountpoint)
    mountpoint.mkdir(parents=True, exist_ok=True)
    seed(data_dir, args.bucket)
    print(f"""
rapidmount demo: gs://{args.bucket} (embedded emulator, data in {data_dir})
mounted at {mountpoint}. In another terminal, try:

    ls -l {mountpoint}/datasets
    cat {mountpoint}/README.txt
    head {mountpoint}/datasets/metrics.csv
    dd if={mountpoint}/datasets/shards/shard-00000.bin of=/dev/null bs=1M
    echo "epoch 101 done" >> {mountpoint}/logs/train.log     # appends stream to the bucket
    cp /etc/hostname {mountpoint}/notes.txt
    python3 -c "import pandas; print(pandas.read_csv('{mountpoint}/datasets/metrics.csv').tail())"

Press Ctrl-C here to unmount.
""", flush=True)
    command = [sys.executable, "-m", "rapidmount.daemon.cli", "--emulator", "--emulator-dir", str(data_dir),
               "--foreground", args.bucket, str(mountpoint)]
    os.execv(sys.executable, command)


if __name__ == "__main__":
    raise SystemExit(main())
