"""The trainer's batch formation, driven directly: oldest tag first, never staler than eta, and it
waits for stragglers rather than form a batch that would strand one."""

from __future__ import annotations

from cadencerl.core.credits import CreditModel
from cadencerl.core.trainer import Trainer
from tests.pools import traj


def trainer(batch: int, eta: int, total: int) -> Trainer:
    return Trainer(CreditModel(batch, eta, total), train_time_s=10.0)


def start(tr: Trainer, tag: int, ids: range) -> list:
    """Admit trajectories under version `tag` (as the controller does through the credit model)."""
    tr.credits.record(tag, len(ids))
    return [traj(i, 100, version=tag) for i in ids]


def left(tr: Trainer) -> dict[int, list[int]]:
    """Completed trajectories not yet consumed, by tag."""
    return {tag: [t.id for t in ts] for tag, ts in tr.completed.items()}


def test_a_batch_waits_until_it_is_full():
    tr = trainer(batch=3, eta=1, total=6)
    a = start(tr, 0, range(3))
    tr.finished(a[0])
    tr.finished(a[1])
    assert tr.try_start(0.0) is None
    tr.finished(a[2])
    assert tr.try_start(1.0) == 11.0        # training takes train_time_s; then version 1 is published
    assert tr.consumed == 3 and left(tr) == {}


def test_a_batch_takes_the_oldest_tag_first_in_completion_order():
    tr = trainer(batch=3, eta=2, total=9)
    old = start(tr, 0, range(0, 3))
    tr.finished(old[0])
    tr.finished(old[1])
    tr.finished(old[2])
    tr.try_start(0.0)
    tr.publish(10.0)                        # version 1; tag-0 work is consumed
    v0 = start(tr, 0, range(10, 12))        # (eta 2 lets version 0 still start work)
    v1 = start(tr, 1, range(20, 23))
    for t in (v1[0], v1[1], v0[1], v1[2], v0[0]):
        tr.finished(t)
    assert tr.try_start(11.0) is not None
    assert left(tr) == {1: [21, 22]}        # both tag-0 ones, then the tag-1 one that finished first
    assert tr.staleness == {0: 3 + 1, 1: 2}  # batch 0: three fresh; batch 1: two tag-0, one tag-1


def test_the_trainer_waits_for_stragglers_so_no_sample_is_staler_than_eta():
    tr = trainer(batch=2, eta=1, total=6)
    first = start(tr, 0, range(0, 4))       # two batches' worth under version 0 (eta 1)
    tr.finished(first[0])
    tr.finished(first[1])
    tr.try_start(0.0)
    tr.publish(10.0)                        # batch 0 consumed; the next is batch 1
    late = start(tr, 1, range(10, 12))
    tr.finished(late[0])
    tr.finished(late[1])
    # two tag-1 samples would make a full batch 1, but then the two tag-0 stragglers would land in
    # batch 2, two versions after theirs: the trainer waits
    assert tr.try_start(11.0) is None
    tr.finished(first[2])
    assert tr.try_start(12.0) is None       # one straggler still out
    tr.finished(first[3])
    assert tr.try_start(13.0) is not None
    assert left(tr) == {1: [10, 11]}        # batch 1 took the stragglers
    tr.publish(23.0)
    assert tr.try_start(24.0) is not None
    assert tr.all_consumed
    assert max(tr.staleness) <= tr.eta and tr.staleness == {0: 2, 1: 4}


def test_the_last_batch_may_be_partial():
    tr = trainer(batch=4, eta=1, total=6)
    a = start(tr, 0, range(6))
    for t in a[:4]:
        tr.finished(t)
    tr.try_start(0.0)
    tr.publish(10.0)
    tr.finished(a[4])
    tr.finished(a[5])
    assert tr.try_start(11.0) is not None   # the remaining two are a batch
    assert tr.consumed == 6 and tr.all_consumed
    assert [sum(c.values()) for c in tr.batch_classes] == [4, 2]


def test_no_batch_starts_while_training():
    tr = trainer(batch=1, eta=1, total=2)
    a = start(tr, 0, range(2))
    tr.finished(a[0])
    tr.finished(a[1])
    assert tr.try_start(0.0) is not None
    assert tr.next_batch == 1               # the batch in training produces version 1
    assert tr.try_start(1.0) is None
    tr.publish(10.0)
    assert tr.version == 1 and tr.publish_times == [10.0]
    assert tr.try_start(10.0) is not None


def test_no_batch_keeps_the_bound_when_the_oldest_completions_do_not():
    """`_take` waits without composing a mix when the oldest n break the bound: exact only if the
    oldest n take at least as much of every tag <= t as any batch the mix could compose."""
    from collections import Counter
    from itertools import combinations

    tr = trainer(batch=2, eta=1, total=8)
    first = start(tr, 0, range(0, 4))
    tr.finished(first[0])
    tr.finished(first[1])
    tr.try_start(0.0)
    tr.publish(10.0)                        # batch 0 consumed; tag 0 has two stragglers out
    late = start(tr, 1, range(10, 12))
    done = [first[2], *late]                # one straggler back, the other still out
    for t in done:
        tr.finished(t)
    def keeps(batch) -> bool:
        return tr._keeps_bound(Counter(t.tag for t in batch))

    oldest = [t for tag in sorted(tr.completed) for t in tr.completed[tag]][:2]
    assert tr._oldest_tags(2) == Counter(t.tag for t in oldest) == {0: 1, 1: 1}
    for batch in combinations(done, 2):     # every batch a mix could compose
        assert keeps(batch) <= keeps(oldest)
    assert not keeps(oldest) and tr._take(11.0) is None
    tr.finished(first[3])
    assert keeps([t for tag in sorted(tr.completed) for t in tr.completed[tag]][:2])
    assert tr._take(12.0) is not None
