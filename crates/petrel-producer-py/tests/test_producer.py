import threading
import time

import pytest

import petrel_producer
from petrel_producer import Producer, QueueFull, ProducerClosed

PAD = "the quick brown fox jumps over the lazy dog, again and again and again"


def test_many_python_threads_deliver_exactly_once(agent):
    p = Producer(agent.endpoint, linger_ms=50, io_thread_count=2, compression="zstd")
    threads, per = 16, 5000

    def work(t):
        for i in range(per):
            p.send({"n": str(t * per + i), "msg": PAD, "thread": t}, time_ns=i,
                   stream="odd" if i % 2 else None)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert p.close(60) == {"undelivered_records": 0, "undelivered_bytes": 0, "spooled_records": 0}
    c = p.counters()
    assert (c["sent"], c["failed"], c["queued_bytes"]) == (threads * per, 0, 0)
    agent.wait_exactly_once(threads * per)


def test_callback_reports_delivery(agent):
    got = []
    done = threading.Event()
    with Producer(agent.endpoint, linger_ms=10) as p:
        p.send_with_callback([("n", "0")], lambda o: (got.append(o), done.set()))
        assert p.flush(30)
        assert done.wait(30)
    assert got == [{"status": "delivered", "attempts": 1}]
    agent.wait_exactly_once(1)


def unreachable(down, max_block_ms):
    return Producer(down.endpoint, total_size_in_bytes=64 << 10,
                    batch_size_threshold_in_bytes=16 << 10, max_block_ms=max_block_ms,
                    linger_ms=10, retries=1000, base_retry_backoff_ms=50,
                    max_retry_backoff_ms=200)


def test_full_queue_rejects_without_blocking_and_close_reports_the_rest(down):
    p = unreachable(down, 0)
    outcome = []
    p.send_with_callback({"n": "first"}, outcome.append)
    accepted, rejected, slowest = 1, 0, 0.0
    for i in range(20000):
        t = time.monotonic()
        try:
            p.send({"n": str(i), "msg": PAD})
            accepted += 1
        except QueueFull:
            rejected += 1
        slowest = max(slowest, time.monotonic() - t)
    # A bound on blocking (send never waits for room), not on speed.
    assert slowest < 0.1, slowest
    assert rejected > 0
    assert p.counters()["rejected_full"] == rejected
    report = p.close(0.5)
    assert report["undelivered_records"] == accepted
    assert p.counters()["failed"] == accepted
    assert outcome and outcome[0]["status"] == "failed" and outcome[0]["attempts"] >= 1
    assert outcome[0]["reason"]
    with pytest.raises(ProducerClosed):
        p.send({"n": "late"})


def test_max_block_ms_waits_then_rejects_and_releases_the_gil(down):
    p = unreachable(down, 200)
    ticks = 0
    stop = threading.Event()

    def ticker():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    th = threading.Thread(target=ticker)
    th.start()
    waits = []
    i = 0
    while len(waits) < 3:
        i += 1
        t = time.monotonic()
        try:
            p.send({"n": str(i), "msg": PAD})
        except QueueFull:
            waits.append(time.monotonic() - t)
        assert i < 100000
    before = ticks
    try:
        p.send({"n": "x", "msg": PAD})
    except QueueFull:
        pass
    during = ticks - before
    stop.set()
    th.join()
    assert all(w >= 0.19 for w in waits), waits
    assert all(w < 3 for w in waits), waits
    # Another Python thread ran while send waited: the GIL was released.
    assert during >= 10, during
    p.close(0)


def test_agent_down_then_up_gets_everything(down):
    p = Producer(down.endpoint, linger_ms=50, batch_count_threshold=500,
                 base_retry_backoff_ms=100, max_retry_backoff_ms=1000, retries=30)
    n = 5000
    for i in range(n):
        p.send({"n": str(i), "msg": PAD})
    time.sleep(3)
    assert p.counters()["sent"] == 0
    down.start()
    assert p.close(60)["undelivered_records"] == 0
    assert p.counters()["sent"] == n
    down.wait_exactly_once(n)


def test_spool_keeps_what_the_agent_could_not_take(down, tmp_path):
    spool = tmp_path / "spool"
    p = Producer(down.endpoint, spool_dir=str(spool), linger_ms=10)
    for i in range(3000):
        p.send({"n": str(i)})
    report = p.close(10)
    assert report["undelivered_records"] == 0
    assert p.counters()["spooled"] == 3000
    down.start()
    p2 = Producer(down.endpoint, spool_dir=str(spool))
    down.wait_exactly_once(3000)
    p2.close(10)


def test_bad_config_is_a_value_error():
    with pytest.raises(ValueError):
        Producer("https://x/")
    with pytest.raises(ValueError):
        Producer("http://127.0.0.1:1/", compression="brotli")
    assert petrel_producer.Producer is Producer


def test_collecting_an_unclosed_producer_with_pending_callbacks_does_not_hang(agent):
    import gc

    got = []
    p = Producer(agent.endpoint, linger_ms=60000)
    for i in range(100):
        p.send_with_callback({"n": str(i)}, got.append)
    del p
    gc.collect()
    # Dropping closed it: the queued records were delivered, callbacks ran.
    assert len(got) == 100 and all(o["status"] == "delivered" for o in got)
    agent.wait_exactly_once(100)
