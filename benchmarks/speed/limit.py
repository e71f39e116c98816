"""Pure-decode limit: P processes decode random 2-frame windows (every camera) from the converted clips."""

import json
import multiprocessing as mp
import random
import resource
import sys
import time

from torchcodec.decoders import VideoDecoder

from lerobot_shards.loader.sources import ShardSource


def work(src, seed, seconds, barrier, q):
    s = ShardSource(src)
    clips = []
    for spec in s.info.shards:
        for e in spec.episodes:
            ep = s.read_episode(spec.index, e)
            clips.append((ep.length, [(c.data, c.frame_mappings) for c in ep.clips.values()]))
    decs = {}
    rng = random.Random(seed)
    barrier.wait()
    n = 0
    t0 = time.perf_counter()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    while time.perf_counter() - t0 < seconds:
        i = rng.randrange(len(clips))
        length, cams = clips[i]
        f = rng.randrange(length)
        for j, (data, maps) in enumerate(cams):
            d = decs.get((i, j))
            if d is None:
                d = decs[(i, j)] = VideoDecoder(data, custom_frame_mappings=maps, num_ffmpeg_threads=1)
            d.get_frames_at([max(f - 1, 0), f])
        n += 1
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    q.put((n / (time.perf_counter() - t0), n, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime))


if __name__ == "__main__":
    src, procs, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    b = mp.Barrier(procs)
    q = mp.Queue()
    ps = [mp.Process(target=work, args=(src, k, seconds, b, q)) for k in range(procs)]
    [p.start() for p in ps]
    res = [q.get() for _ in ps]
    [p.join() for p in ps]
    print(
        json.dumps(
            {
                "samples_per_s": round(sum(r[0] for r in res), 2),
                "cpu_ms_per_sample": round(1000 * sum(r[2] for r in res) / sum(r[1] for r in res), 1),
            }
        )
    )
