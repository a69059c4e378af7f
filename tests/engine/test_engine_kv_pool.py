"""KVPool: sizing from a memory budget, allocation, freeing, double-free detection."""

import random

import pytest
import torch

from corral.engine.kvcache.kv_pool import PAD_SLOT, DoubleFreeError, KVIntegrityError, KVPool


def _buffer_bytes(pool: KVPool) -> int:
    return sum(b.numel() * b.element_size() for b in pool.k_buffers + pool.v_buffers)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("extra", [0, 1, 150])
def test_from_budget_is_the_largest_pool_that_fits(dtype: torch.dtype, extra: int) -> None:
    layers, heads, head_dim = 3, 2, 8
    one = KVPool(layers, heads, head_dim, num_slots=2, dtype=dtype)
    per_slot = _buffer_bytes(one) // 2  # measured from real buffers, not from the formula
    budget = 37 * per_slot + extra % per_slot
    pool = KVPool.from_budget(budget, layers, heads, head_dim, dtype=dtype)
    assert pool.num_slots == 37
    assert _buffer_bytes(pool) <= budget < _buffer_bytes(pool) + per_slot
    assert KVPool.slot_bytes(layers, heads, head_dim, dtype) == per_slot
    assert len(pool.k_buffers) == len(pool.v_buffers) == layers
    assert all(b.shape == (37, heads, head_dim) and b.dtype == dtype for b in pool.k_buffers)


def test_from_budget_too_small_says_what_to_do() -> None:
    per_slot = KVPool.slot_bytes(2, 2, 4, torch.float32)
    with pytest.raises(ValueError, match="Raise the KV memory budget"):
        KVPool.from_budget(2 * per_slot - 1, 2, 2, 4)


def test_fresh_pool_reserves_the_pad_slot() -> None:
    pool = KVPool(1, 1, 4, num_slots=10)
    assert pool.num_free == pool.capacity == 9
    got = pool.alloc(9)
    assert got is not None
    assert sorted(got.tolist()) == list(range(1, 10))
    assert PAD_SLOT not in got.tolist()
    assert got.dtype == torch.int64 and got.device.type == "cpu"
    pool.check_integrity()


def test_alloc_beyond_capacity_returns_none_and_changes_nothing() -> None:
    pool = KVPool(1, 1, 4, num_slots=8)
    assert pool.alloc(8) is None  # capacity is 7
    first = pool.alloc(5)
    assert first is not None
    assert pool.alloc(3) is None
    assert pool.num_free == 2
    rest = pool.alloc(2)
    assert rest is not None and pool.num_free == 0
    assert pool.alloc(1) is None
    assert pool.alloc(0).numel() == 0
    assert set(first.tolist()).isdisjoint(rest.tolist())
    pool.check_integrity()


def test_free_then_realloc_reuses_slots() -> None:
    pool = KVPool(1, 1, 4, num_slots=6)
    a = pool.alloc(5)
    pool.free(a[1:3])
    assert pool.num_free == 2
    again = pool.alloc(2)
    assert sorted(again.tolist()) == sorted(a[1:3].tolist())
    assert pool.num_free == 0
    pool.check_integrity()


def test_returned_indices_do_not_alias_the_free_list() -> None:
    pool = KVPool(1, 1, 4, num_slots=6)
    a = pool.alloc(2)
    a.fill_(3)  # the caller scribbling on its tensor must not corrupt the pool
    pool.check_integrity()
    rest = pool.alloc(3)
    assert sorted(rest.tolist()) == [3, 4, 5]


def test_double_free_raises_and_leaves_pool_untouched() -> None:
    pool = KVPool(1, 1, 4, num_slots=6)
    a = pool.alloc(3)
    pool.free(a[:1])
    with pytest.raises(DoubleFreeError, match="already free"):
        pool.free(a)  # a[0] is already free; a[1:] must not be freed either
    assert pool.num_free == 3
    assert not pool.is_free(a[1:]).any()
    with pytest.raises(DoubleFreeError, match="twice"):
        pool.free(torch.tensor([a[1], a[1]]))
    assert pool.num_free == 3
    pool.check_integrity()


@pytest.mark.parametrize("bad", [PAD_SLOT, -1, 6, 100])
def test_free_of_a_slot_that_is_not_allocatable_raises(bad: int) -> None:
    pool = KVPool(1, 1, 4, num_slots=6)
    pool.alloc(5)
    with pytest.raises(KVIntegrityError, match="not allocatable"):
        pool.free(torch.tensor([bad]))
    assert pool.num_free == 0


def test_random_alloc_free_agrees_with_a_set_model() -> None:
    rng = random.Random(1234)
    pool = KVPool(1, 1, 1, num_slots=300)
    held: list[int] = []
    for _ in range(400):
        if held and rng.random() < 0.5:
            rng.shuffle(held)
            k = rng.randint(1, len(held))
            pool.free(torch.tensor(held[:k]))
            held = held[k:]
        else:
            n = rng.randint(0, 40)
            got = pool.alloc(n)
            if n > pool.capacity - len(held):
                assert got is None
                continue
            assert got is not None and got.numel() == n
            assert set(got.tolist()).isdisjoint(held)
            held += got.tolist()
        assert pool.num_free == pool.capacity - len(held)
        free = set(pool.free_slots().tolist())
        assert free.isdisjoint(held) and len(free) + len(held) == pool.capacity
    pool.check_integrity()


def test_integrity_check_detects_a_corrupted_free_list() -> None:
    pool = KVPool(1, 1, 4, num_slots=6)
    a = pool.alloc(2)
    pool._stack[0] = a[0]  # white-box corruption: an allocated slot put on the free list
    with pytest.raises(KVIntegrityError):
        pool.check_integrity()


def test_buffers_store_at_allocated_slots() -> None:
    pool = KVPool(2, 2, 4, num_slots=8, dtype=torch.float16)
    slots = pool.alloc(3)
    k = torch.randn(3, 2, 4, dtype=torch.float16)
    pool.k_buffers[1][slots] = k
    assert torch.equal(pool.k_buffers[1][slots], k)
    assert pool.k_buffers[0].abs().sum() == 0  # zero-initialised, other layers untouched
    assert pool.v_buffers[1].abs().sum() == 0


def test_large_alloc_and_free_round_trip() -> None:
    pool = KVPool(1, 1, 1, num_slots=20_001)
    got = pool.alloc(20_000)
    assert torch.equal(torch.sort(got).values, torch.arange(1, 20_001))
    pool.free(got[::2])
    pool.free(got[1::2])
    assert pool.num_free == 20_000
    pool.check_integrity()


@pytest.mark.parametrize("n", [3, 1000])  # both validation paths: short list and vectorised
def test_duplicate_within_one_free_call_raises(n: int) -> None:
    pool = KVPool(1, 1, 1, num_slots=n + 1)
    got = pool.alloc(n)
    twice = torch.cat([got, got[-1:]])
    with pytest.raises(DoubleFreeError, match="twice"):
        pool.free(twice)
    assert pool.num_free == 0
    pool.free(got)
    assert pool.num_free == n
    pool.check_integrity()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_pool_keeps_its_free_list_on_the_host() -> None:
    pool = KVPool.from_budget(1 << 20, 2, 2, 16, dtype=torch.float16, device="cuda")
    assert pool.k_buffers[0].is_cuda and pool.v_buffers[1].is_cuda
    slots = pool.alloc(4)
    assert slots.device.type == "cpu"
    pool.k_buffers[0][slots.cuda()] = 1.0
    pool.free(slots.cuda())  # device indices are accepted too
    assert pool.num_free == pool.capacity
    pool.check_integrity()
