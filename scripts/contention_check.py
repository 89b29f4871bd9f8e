"""Does a second torch thread in the engine's own process (an instance's builder beside its engine)
slow a prefill more than a second process (the other instance) does? SmolLM2-135M's shape with
random weights, float32, one torch thread each: a full forward of N tokens, timed (wall and the
thread's CPU) alone, beside a thread and beside a process running 64-token forwards. Then three
threads on the two cores, as in a served sweep at load (this engine, the other instance's engine
as a process, this instance's builder as a thread): with the builder at nice 0 and at nice 10
(`reuse.behind_nice`), against what weighted processor sharing predicts (sim/served.py
`core_shares`: 1.5x and 1.05x).

    PYTHONPATH=src python scripts/contention_check.py [N=584]
"""
import sys, time, threading, multiprocessing as mp, statistics as st
import torch
torch.set_num_threads(1)
from rcllm.bench import shapes as sh
from rcllm.routing.profiles import MODELS

SHAPE = sh.Shape(MODELS["smollm2-135m"], 49152)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 584

def model():
    return sh.random_transformer(SHAPE, torch.device("cpu"), torch.float32, 2048)

def busy_loop(stop, nice=0):
    torch.set_num_threads(1)
    if nice:
        from rcllm.kvstore.front import lower_priority
        lower_priority(nice)
    m = model()
    ids = torch.randint(0, 1000, (64,))
    with torch.inference_mode():
        while not stop.is_set():
            m.forward(ids)

def timed(m, reps=12):
    ids = torch.randint(0, 1000, (N,))
    out = []
    with torch.inference_mode():
        m.forward(ids)
        for _ in range(reps):
            t0 = time.perf_counter(); c0 = time.thread_time()
            m.forward(ids)
            out.append(((time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3))
    return st.median(w for w, _ in out), st.median(c for _, c in out)

if __name__ == "__main__":
    m = model()
    print("alone          wall/cpu ms %.0f / %.0f" % timed(m))
    stop = threading.Event(); t = threading.Thread(target=busy_loop, args=(stop,)); t.start()
    time.sleep(1); print("+thread (GIL)  wall/cpu ms %.0f / %.0f" % timed(m)); stop.set(); t.join()
    ctx = mp.get_context("spawn"); ev = ctx.Event(); p = ctx.Process(target=busy_loop, args=(ev,)); p.start()
    time.sleep(8); print("+process       wall/cpu ms %.0f / %.0f" % timed(m)); ev.set(); p.join()
    print("alone again    wall/cpu ms %.0f / %.0f" % timed(m))
    ev = ctx.Event(); p = ctx.Process(target=busy_loop, args=(ev,)); p.start(); time.sleep(8)
    for nice in (0, 10):
        stop = threading.Event(); t = threading.Thread(target=busy_loop, args=(stop, nice))
        t.start(); time.sleep(1)
        print("+process +thread at nice %2d  wall/cpu ms %.0f / %.0f" % ((nice,) + timed(m)))
        stop.set(); t.join()
    ev.set(); p.join()
