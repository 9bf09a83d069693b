import asyncio

import numpy as np
import pytest

from sessions.media_queue import MediaQueue


def frames(n: int, value: int = 0) -> np.ndarray:
    out = np.zeros((n, 4, 4, 3), dtype=np.uint8)
    out[:] = np.arange(value, value + n, dtype=np.uint8)[:, None, None, None]
    return out


def test_fifo_with_pts_and_strictly_increasing_guard() -> None:
    queue = MediaQueue(capacity_frames=10)
    assert queue.put_chunk(frames(3), [0, 3000, 6000], chunk=0, segment=0) == 3
    assert queue.put_chunk(frames(2, 10), [6000, 9000], chunk=1, segment=0) == 1  # 6000 repeats
    assert queue.dropped_non_monotonic == 1
    popped = [queue.pop() for _ in range(4)]
    assert [(f.pts_90k, f.chunk, int(f.rgb[0, 0, 0])) for f in popped] == [
        (0, 0, 0),
        (3000, 0, 1),
        (6000, 0, 2),
        (9000, 1, 11),
    ]
    assert queue.pop() is None


def test_full_queue_drops_the_oldest() -> None:
    queue = MediaQueue(capacity_frames=3)
    queue.put_chunk(frames(5), [0, 1, 2, 3, 4], chunk=0, segment=0)
    assert [queue.pop().pts_90k for _ in range(3)] == [2, 3, 4]
    assert (queue.dropped_overflow, queue.frames_in) == (2, 5)


def test_flush_before_drops_only_older_frames() -> None:
    queue = MediaQueue(capacity_frames=10)
    queue.put_chunk(frames(4), [0, 10, 20, 30], chunk=0, segment=0)
    assert queue.flush_before(20) == 2
    assert [queue.pop().pts_90k for _ in range(2)] == [20, 30]
    assert queue.dropped_flush == 2


def test_rejects_malformed_chunks() -> None:
    queue = MediaQueue(capacity_frames=2)
    with pytest.raises(ValueError, match="uint8"):
        queue.put_chunk(np.zeros((1, 4, 4, 3), np.float32), [0], chunk=0, segment=0)
    with pytest.raises(ValueError, match="PTS values"):
        queue.put_chunk(frames(2), [0], chunk=0, segment=0)
    with pytest.raises(ValueError, match=">= 1"):
        MediaQueue(capacity_frames=0)


async def test_wait_nonempty_wakes_on_put_and_close_releases_waiters() -> None:
    queue = MediaQueue(capacity_frames=4)
    assert await queue.wait_nonempty(0.01) is False
    waiter = asyncio.create_task(queue.wait_nonempty(1.0))
    await asyncio.sleep(0)
    queue.put_chunk(frames(1), [0], chunk=0, segment=0)
    assert await waiter is True
    queue.pop()
    waiter = asyncio.create_task(queue.wait_nonempty(1.0))
    await asyncio.sleep(0)
    queue.close()
    assert await waiter is True
    assert queue.put_chunk(frames(1), [5], chunk=1, segment=0) == 0 and len(queue) == 0
